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

/// Fails when something already listens on `addr`: SO_REUSEPORT would otherwise let a
/// second gateway (or anything of the same user) silently share the port. A socket without
/// SO_REUSEPORT cannot bind where a listener is, so a trial bind tells.
pub fn ensure_free(addr: SocketAddr) -> io::Result<()> {
    if addr.port() == 0 {
        return Ok(());
    }
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    // SO_REUSEADDR: connections of an earlier run in TIME_WAIT do not count.
    socket.set_reuse_address(true)?;
    match socket.bind(&addr.into()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AddrInUse => Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!(
                "{addr} is already in use (another rolter, or another program): rolter does not \
                 share a port silently; stop the other one, or replace a running rolter without \
                 dropping connections with `rolter run --upgrade`"
            ),
        )),
        Err(e) => Err(io::Error::new(
            e.kind(),
            format!("cannot listen on {addr}: {e}"),
        )),
    }
}

/// Binds `count` listeners on `addr`, refusing a port something already listens on. Port 0
/// picks one free port shared by all of them.
pub fn bind_all(addr: SocketAddr, count: usize) -> io::Result<Vec<TcpListener>> {
    ensure_free(addr)?;
    let first = bind_reuseport(addr)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}")))?;
    let actual = first.local_addr()?;
    let mut all = vec![first];
    for _ in 1..count {
        all.push(bind_reuseport(actual)?);
    }
    Ok(all)
}

/// Binds the admin listener (no SO_REUSEPORT: one admin socket per gateway).
pub fn bind_admin(addr: SocketAddr) -> io::Result<TcpListener> {
    let l = TcpListener::bind(addr)
        .map_err(|e| io::Error::new(e.kind(), format!("admin listener {addr}: {e}")))?;
    l.set_nonblocking(true)?;
    Ok(l)
}
