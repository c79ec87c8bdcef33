//! One native-protocol connection: read frames, dispatch, answer.

use std::cell::Cell;
use std::rc::Rc;

use glommio::net::TcpStream;

use crate::core::Core;

/// Serves one connection until it closes.
pub async fn serve(core: Rc<Core>, stream: TcpStream, active: Rc<Cell<usize>>) {
    let _ = (core, stream, active);
}
