//! Listeners: the connection pipeline ([`connection`], protocol-neutral)
//! with a codec and dispatch per protocol ([`native`]), and the HTTP
//! metrics endpoint ([`http`]). A listener knows the service
//! ([`crate::service`]) and nothing below it.

pub mod connection;
pub mod http;
pub mod native;
