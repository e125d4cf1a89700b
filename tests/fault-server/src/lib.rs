//! `retrywise-fault-server`: a fake OpenAI- and Anthropic-compatible upstream that
//! injects the failures retrywise has to decide about (statuses, Retry-After in all
//! three forms, hangs, resets, dropped connections, malformed bodies, streams cut or
//! stalled midway) and records every attempt it receives.
//!
//! End-to-end tests in every binding point an unmodified SDK at the server and pick
//! a fault per request by model name (`"model": "fb-stream-cut"`, see [`model`]) or
//! for every request by path (`http://127.0.0.1:PORT/s/<spec>/v1`, see [`spec`]),
//! then read `/control/requests` to check how many physical attempts each model got,
//! when, and how each exchange ended. See `README.md` for both grammars, the exact
//! bytes of every fault and the control API.
//!
//! Rust tests can run the server in-process with [`spawn_background`] (blocking
//! code) or [`serve`] / [`serve_with_shutdown`] (inside a Tokio runtime).

pub mod answer;
mod body;
mod conn;
mod control;
pub mod model;
mod plan;
pub mod ratelimit;
mod request;
mod service;
pub mod shapes;
pub mod spec;
pub mod state;

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinSet;

use conn::{ConnControl, ConnIo};

pub use model::ModelFault;
pub use spec::{Fault, RetryAfterHint, SpecError};
pub use state::{Counts, Ending, Filter, Record, State};

/// Serves on `listener` until the future is dropped, with fresh state.
pub async fn serve(listener: TcpListener) -> io::Result<()> {
    serve_with_shutdown(listener, std::future::pending()).await
}

/// Serves on `listener` until `shutdown` completes, with fresh state. Open
/// connections (including hung and streaming ones) are aborted on return.
pub async fn serve_with_shutdown(listener: TcpListener, shutdown: impl Future<Output = ()>) -> io::Result<()> {
    serve_state(listener, Arc::new(State::new()), shutdown).await
}

/// Serves with caller-provided state, so an in-process test can inspect records
/// directly instead of going through `/control/requests`.
pub async fn serve_state(
    listener: TcpListener,
    state: Arc<State>,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    // Connection tasks live in this set so they end with the server instead of
    // outliving it inside the caller's runtime.
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => return Ok(()),
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    // Small request/response exchanges must not wait on Nagle.
                    let _ = stream.set_nodelay(true);
                    let state = Arc::clone(&state);
                    connections.spawn(async move {
                        let _open = state.connection_guard();
                        let svc_state = Arc::clone(&state);
                        let control = Arc::new(ConnControl::default());
                        let io = TokioIo::new(ConnIo::new(stream, Arc::clone(&control)));
                        let svc = service_fn(move |req| {
                            service::handle(Arc::clone(&svc_state), Arc::clone(&control), req)
                        });
                        // Errors here are the faults themselves (drop, reset, cut, hang
                        // cap) or clients going away: nothing to report.
                        let _ = http1::Builder::new().serve_connection(io, svc).await;
                    });
                }
                Err(e) => {
                    // Typically fd exhaustion: back off briefly instead of spinning,
                    // and keep serving the connections already open.
                    eprintln!("retrywise-fault-server: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
        }
    }
}

/// A server running on its own thread and runtime; stopped when dropped.
pub struct ServerHandle {
    addr: SocketAddr,
    state: Arc<State>,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<io::Result<()>>>,
}

impl ServerHandle {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Base URL for a spec, e.g. `http://127.0.0.1:PORT/s/status:503`; append `/v1`
    /// for OpenAI SDKs (Anthropic SDKs add it themselves).
    pub fn base_url(&self, spec: &str) -> String {
        format!("http://{}/s/{spec}", self.addr)
    }

    /// The live state: records, counts and `reset`.
    pub fn state(&self) -> &Arc<State> {
        &self.state
    }

    /// Stops the server and waits for its thread; also done on drop.
    pub fn shutdown(mut self) -> io::Result<()> {
        self.stop()
    }

    fn stop(&mut self) -> io::Result<()> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        match self.thread.take().map(JoinHandle::join) {
            None => Ok(()),
            Some(Ok(result)) => result,
            Some(Err(_)) => Err(io::Error::other("fault server thread panicked")),
        }
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// Starts a server on an ephemeral 127.0.0.1 port in a background thread with its
/// own single-threaded runtime, for tests that are not async themselves. The port
/// is bound before this returns, so the server is immediately connectable.
pub fn spawn_background() -> io::Result<(SocketAddr, ServerHandle)> {
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0))?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let state = Arc::new(State::new());
    let thread_state = Arc::clone(&state);
    let (tx, rx) = oneshot::channel::<()>();
    let thread = std::thread::Builder::new()
        .name("retrywise-fault-server".into())
        .spawn(move || {
            runtime.block_on(async move {
                let listener = TcpListener::from_std(listener)?;
                serve_state(listener, thread_state, async {
                    // A dropped sender also means "stop".
                    let _ = rx.await;
                })
                .await
            })
        })?;
    let handle = ServerHandle {
        addr,
        state,
        shutdown: Some(tx),
        thread: Some(thread),
    };
    Ok((addr, handle))
}
