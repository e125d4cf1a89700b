//! The connection wrapper that lets a request end its connection with a TCP reset.
//!
//! Hyper owns the socket while it serves a connection, and a service error only
//! makes it close the socket normally (FIN). A reset (RST) needs `SO_LINGER` 0 set
//! right before the close, so the service flags the connection and the socket's
//! owner sets the option when hyper drops it.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// Shared between a connection's socket and the requests served on it.
#[derive(Debug, Default)]
pub struct ConnControl {
    reset: AtomicBool,
}

impl ConnControl {
    /// Makes the connection's close a reset; the service then aborts it.
    pub fn reset_on_close(&self) {
        self.reset.store(true, Ordering::Relaxed);
    }
}

/// A TCP stream that closes with a reset when its [`ConnControl`] asks.
pub struct ConnIo {
    inner: TcpStream,
    control: Arc<ConnControl>,
}

impl ConnIo {
    pub fn new(inner: TcpStream, control: Arc<ConnControl>) -> Self {
        Self { inner, control }
    }
}

impl Drop for ConnIo {
    fn drop(&mut self) {
        if self.control.reset.load(Ordering::Relaxed) {
            // Zero linger never blocks: the close discards the buffers and sends RST.
            let _ = self.inner.set_zero_linger();
        }
    }
}

impl AsyncRead for ConnIo {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for ConnIo {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
