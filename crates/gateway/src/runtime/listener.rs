//! Binding the client listener: one SO_REUSEPORT socket per worker on the same address, so
//! the kernel spreads connections over cores.
//!
//! Owns socket options for listening sockets only.

use std::io;
use std::net::{SocketAddr, TcpListener};

use socket2::{Domain, Protocol, Socket, Type};

const BACKLOG: i32 = 4096;

/// Binds one listening socket with SO_REUSEPORT.
pub fn bind_reuseport(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.set_tcp_nodelay(true)?;
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG)?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

/// Binds `count` listeners on `addr`. Port 0 picks one free port shared by all of them.
pub fn bind_all(addr: SocketAddr, count: usize) -> io::Result<Vec<TcpListener>> {
    let first = bind_reuseport(addr)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}")))?;
    let actual = first.local_addr()?;
    let mut all = vec![first];
    for _ in 1..count {
        all.push(bind_reuseport(actual)?);
    }
    Ok(all)
}
