//! SaslHandshake, SaslAuthenticate (with KIP-368 re-authentication),
//! DescribeUserScramCredentials and AlterUserScramCredentials, onto
//! [`crate::service::auth`] and [`crate::service::users`].

use kafka_protocol::messages::alter_user_scram_credentials_response::AlterUserScramCredentialsResult;
use kafka_protocol::messages::describe_user_scram_credentials_response::{
    CredentialInfo, DescribeUserScramCredentialsResult,
};
use kafka_protocol::messages::{
    AlterUserScramCredentialsRequest, AlterUserScramCredentialsResponse,
    DescribeUserScramCredentialsRequest, DescribeUserScramCredentialsResponse,
    SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse,
};

use kafka_protocol::messages::create_acls_response::AclCreationResult;
use kafka_protocol::messages::delete_acls_response::{
    DeleteAclsFilterResult, DeleteAclsMatchingAcl,
};
use kafka_protocol::messages::describe_acls_response::{AclDescription, DescribeAclsResource};
use kafka_protocol::messages::{
    CreateAclsRequest, CreateAclsResponse, DeleteAclsRequest, DeleteAclsResponse,
    DescribeAclsRequest, DescribeAclsResponse,
};
use weir_replication::meta::AclBinding;
use weir_replication::security::AclFilter;

use super::common::*;
use crate::service::acl::{self, AclError};
use crate::service::auth::{Session, Step};
use crate::service::users::{self, Upsertion, UserError};

/// SaslHandshake: the mechanism, if enabled on this listener; the
/// enabled ones either way.
pub(super) fn sasl_handshake(
    core: &Core,
    session: &Session,
    r: SaslHandshakeRequest,
) -> SaslHandshakeResponse {
    let enabled = Session::mechanisms(core);
    let mut resp = SaslHandshakeResponse::default();
    resp.mechanisms = if session.protocol.sasl() {
        enabled.iter().map(|m| s(m.name())).collect()
    } else {
        Vec::new()
    };
    if let Err(e) = session.handshake(r.mechanism.as_str(), enabled) {
        tracing::debug!(peer = %session.peer, error = e, "SaslHandshake refused");
        resp.error_code = E::UnsupportedSaslMechanism.code();
    }
    resp
}

/// SaslAuthenticate: one step of the login; `true` when the connection
/// closes after the answer (a failed login).
pub(super) async fn sasl_authenticate(
    core: &Rc<Core>,
    session: &Session,
    r: SaslAuthenticateRequest,
) -> (SaslAuthenticateResponse, bool) {
    let mut resp = SaslAuthenticateResponse::default();
    if !session.protocol.sasl() {
        resp.error_code = E::IllegalSaslState.code();
        resp.error_message = Some(s(format!(
            "this is a {} listener: it takes no SASL login",
            session.protocol.name()
        )));
        return (resp, true);
    }
    match session.authenticate(core, &r.auth_bytes).await {
        Ok(Step::Continue(bytes)) => {
            resp.auth_bytes = Bytes::from(bytes);
            (resp, false)
        }
        Ok(Step::Done { bytes, lifetime_ms }) => {
            resp.auth_bytes = Bytes::from(bytes);
            resp.session_lifetime_ms = lifetime_ms;
            (resp, false)
        }
        Err(e) => {
            resp.error_code = E::SaslAuthenticationFailed.code();
            resp.error_message = Some(s(e.message));
            (resp, true)
        }
    }
}

fn user_error_code(e: &UserError) -> i16 {
    weir_kafka::error::coordinator_code(e.code())
}

/// DescribeUserScramCredentials.
pub(super) fn describe_user_scram_credentials(
    core: &Core,
    r: DescribeUserScramCredentialsRequest,
) -> DescribeUserScramCredentialsResponse {
    let names = r
        .users
        .map(|us| us.into_iter().map(|u| u.name.to_string()).collect());
    let mut resp = DescribeUserScramCredentialsResponse::default();
    resp.results = users::describe_scram(core, names)
        .into_iter()
        .map(|(user, r)| {
            let mut out = DescribeUserScramCredentialsResult::default();
            out.user = s(user);
            match r {
                Ok(infos) => {
                    out.credential_infos = infos
                        .into_iter()
                        .map(|(m, i)| {
                            let mut c = CredentialInfo::default();
                            c.mechanism = m;
                            c.iterations = i;
                            c
                        })
                        .collect();
                }
                Err(e) => {
                    out.error_code = user_error_code(&e);
                    out.error_message = Some(s(e.to_string()));
                }
            }
            out
        })
        .collect();
    resp
}

/// AlterUserScramCredentials.
pub(super) async fn alter_user_scram_credentials(
    core: &Rc<Core>,
    r: AlterUserScramCredentialsRequest,
) -> AlterUserScramCredentialsResponse {
    let deletions = r
        .deletions
        .into_iter()
        .map(|d| (d.name.to_string(), d.mechanism))
        .collect();
    let upsertions = r
        .upsertions
        .into_iter()
        .map(|u| Upsertion {
            user: u.name.to_string(),
            mechanism: u.mechanism,
            iterations: u.iterations,
            salt: u.salt.to_vec(),
            salted_password: u.salted_password.to_vec(),
        })
        .collect();
    let mut resp = AlterUserScramCredentialsResponse::default();
    resp.results = users::alter_scram(core, deletions, upsertions)
        .await
        .into_iter()
        .map(|(user, r)| {
            let mut out = AlterUserScramCredentialsResult::default();
            out.user = s(user);
            if let Err(e) = r {
                out.error_code = user_error_code(&e);
                out.error_message = Some(s(e.to_string()));
            }
            out
        })
        .collect();
    resp
}

fn acl_error_code(e: &AclError) -> i16 {
    weir_kafka::error::coordinator_code(e.code())
}

/// CreateAcls.
pub(super) async fn create_acls(core: &Rc<Core>, r: CreateAclsRequest) -> CreateAclsResponse {
    let bindings = r
        .creations
        .into_iter()
        .map(|c| AclBinding {
            resource_type: c.resource_type,
            resource_name: c.resource_name.to_string(),
            pattern_type: c.resource_pattern_type,
            principal: c.principal.to_string(),
            host: c.host.to_string(),
            operation: c.operation,
            permission: c.permission_type,
        })
        .collect();
    let mut resp = CreateAclsResponse::default();
    resp.results = acl::create(core, bindings)
        .await
        .into_iter()
        .map(|r| {
            let mut out = AclCreationResult::default();
            if let Err(e) = r {
                out.error_code = acl_error_code(&e);
                out.error_message = Some(s(e.to_string()));
            }
            out
        })
        .collect();
    resp
}

fn filter(
    resource_type: i8,
    name: Option<StrBytes>,
    pattern_type: i8,
    principal: Option<StrBytes>,
    host: Option<StrBytes>,
    operation: i8,
    permission: i8,
) -> AclFilter {
    AclFilter {
        resource_type,
        resource_name: name.map(|n| n.to_string()),
        pattern_type,
        principal: principal.map(|p| p.to_string()),
        host: host.map(|h| h.to_string()),
        operation,
        permission,
    }
}

/// DescribeAcls: the bindings the filter matches, grouped by resource.
pub(super) fn describe_acls(core: &Core, r: DescribeAclsRequest) -> DescribeAclsResponse {
    let f = filter(
        r.resource_type_filter,
        r.resource_name_filter,
        r.pattern_type_filter,
        r.principal_filter,
        r.host_filter,
        r.operation,
        r.permission_type,
    );
    let mut resources: Vec<DescribeAclsResource> = Vec::new();
    for b in acl::describe(core, &f) {
        let d = AclDescription::default()
            .with_principal(s(b.principal.clone()))
            .with_host(s(b.host.clone()))
            .with_operation(b.operation)
            .with_permission_type(b.permission);
        match resources.iter_mut().find(|x| {
            x.resource_type == b.resource_type
                && x.pattern_type == b.pattern_type
                && x.resource_name.as_str() == b.resource_name
        }) {
            Some(x) => x.acls.push(d),
            None => resources.push(
                DescribeAclsResource::default()
                    .with_resource_type(b.resource_type)
                    .with_resource_name(s(b.resource_name))
                    .with_pattern_type(b.pattern_type)
                    .with_acls(vec![d]),
            ),
        }
    }
    DescribeAclsResponse::default().with_resources(resources)
}

/// DeleteAcls: per filter, the bindings deleted.
pub(super) async fn delete_acls(core: &Rc<Core>, r: DeleteAclsRequest) -> DeleteAclsResponse {
    let filters = r
        .filters
        .into_iter()
        .map(|f| {
            filter(
                f.resource_type_filter,
                f.resource_name_filter,
                f.pattern_type_filter,
                f.principal_filter,
                f.host_filter,
                f.operation,
                f.permission_type,
            )
        })
        .collect();
    let results = acl::delete(core, filters).await;
    DeleteAclsResponse::default().with_filter_results(
        results
            .into_iter()
            .map(|r| match r {
                Ok(deleted) => DeleteAclsFilterResult::default().with_matching_acls(
                    deleted
                        .into_iter()
                        .map(|b| {
                            DeleteAclsMatchingAcl::default()
                                .with_resource_type(b.resource_type)
                                .with_resource_name(s(b.resource_name))
                                .with_pattern_type(b.pattern_type)
                                .with_principal(s(b.principal))
                                .with_host(s(b.host))
                                .with_operation(b.operation)
                                .with_permission_type(b.permission)
                        })
                        .collect(),
                ),
                Err(e) => DeleteAclsFilterResult::default()
                    .with_error_code(acl_error_code(&e))
                    .with_error_message(Some(s(e.to_string()))),
            })
            .collect(),
    )
}
