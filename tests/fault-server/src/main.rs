//! `retrywise-fault-server [--port N] [--exit-on-stdin-close]`
//!
//! Prints exactly one line, `LISTENING 127.0.0.1:<port>`, once the port is bound,
//! so a test harness can start it with port 0 and read the real port from stdout.

use std::io::{Read, Write};
use std::process::ExitCode;

use tokio::net::TcpListener;
use tokio::sync::oneshot;

const USAGE: &str = "\
usage: retrywise-fault-server [--port N] [--exit-on-stdin-close]

  --port N                 port on 127.0.0.1 (default 0: an ephemeral port)
  --exit-on-stdin-close    exit when stdin reaches EOF, so a harness that dies
                           (and thereby closes the pipe) never leaks the server
  -h, --help               this text

Prints `LISTENING 127.0.0.1:<port>` on stdout once bound; exits on SIGTERM/ctrl-c.";

struct Args {
    port: u16,
    exit_on_stdin_close: bool,
}

fn parse_args() -> Result<Option<Args>, String> {
    let mut args = Args {
        port: 0,
        exit_on_stdin_close: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) => (f.to_owned(), Some(v.to_owned())),
            None => (arg.clone(), None),
        };
        match flag.as_str() {
            "-h" | "--help" => return Ok(None),
            "--exit-on-stdin-close" if inline.is_none() => args.exit_on_stdin_close = true,
            "--port" => {
                let value = inline.or_else(|| it.next()).ok_or("--port needs a value")?;
                args.port = value
                    .parse()
                    .map_err(|_| format!("--port: not a port number: {value:?}"))?;
            }
            _ => return Err(format!("unknown argument {arg:?}")),
        }
    }
    Ok(Some(args))
}

/// Resolves when stdin reaches EOF (or fails). Reads on a plain thread: a Tokio
/// stdin read would sit in the blocking pool and hold up runtime shutdown.
fn stdin_closed() -> oneshot::Receiver<()> {
    let (tx, rx) = oneshot::channel();
    let spawned = std::thread::Builder::new().name("stdin-watch".into()).spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut buf = [0u8; 1024];
        while matches!(stdin.read(&mut buf), Ok(n) if n > 0) {}
        let _ = tx.send(());
    });
    if let Err(e) = spawned {
        // Without the watcher the flag cannot be honoured; say so rather than
        // silently turning it off. The dropped sender makes `rx` resolve.
        eprintln!("retrywise-fault-server: cannot watch stdin ({e}); exiting");
    }
    rx
}

async fn terminated() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(Some(args)) => args,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("retrywise-fault-server: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let listener = match TcpListener::bind(("127.0.0.1", args.port)).await {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("retrywise-fault-server: cannot bind 127.0.0.1:{}: {e}", args.port);
            return ExitCode::FAILURE;
        }
    };
    let addr = match listener.local_addr() {
        Ok(addr) => addr,
        Err(e) => {
            eprintln!("retrywise-fault-server: no local address: {e}");
            return ExitCode::FAILURE;
        }
    };
    {
        let mut out = std::io::stdout().lock();
        if writeln!(out, "LISTENING {addr}").and_then(|()| out.flush()).is_err() {
            // Nobody can learn the port: serving would only leak a process.
            return ExitCode::FAILURE;
        }
    }

    let stdin_eof = async {
        if args.exit_on_stdin_close {
            let _ = stdin_closed().await;
        } else {
            std::future::pending::<()>().await;
        }
    };
    let shutdown = async {
        tokio::select! {
            () = terminated() => {}
            () = stdin_eof => {}
        }
    };
    match retrywise_fault_server::serve_with_shutdown(listener, shutdown).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("retrywise-fault-server: {e}");
            ExitCode::FAILURE
        }
    }
}
