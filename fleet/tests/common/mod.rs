//! A `redis-server` a test starts on a free port of 127.0.0.1 and stops
//! (`$RETRYWISE_REDIS_SERVER`, else `redis-server` on PATH).

use retrywise::{CallSpec, Engine, Outcome};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// One upstream `up` whose breaker opens at 2 failures of 4 calls, for 30 s.
pub const POLICY: &str = "
max_attempts: 1
breaker:
  min_calls: 4
  window_size: 4
  failure_rate: 0.5
  open_ms: 30000
  open_max_ms: 60000
  open_jitter: 0
  half_open_probes: 1
  close_after: 1
  hold: false
";

/// One call of one attempt answered with `status`: "sent", or the refusal's reason.
pub fn call(e: &Engine, status: u16) -> String {
    let mut c = e.begin(CallSpec::new("up").deadline_ms(60_000));
    match c.next_attempt() {
        Ok(_) => {
            c.report(&Outcome::status(status));
            "sent".into()
        }
        Err(s) => s.reason.as_str().into(),
    }
}

/// A `redis-server` of this test: no persistence, so a restart is empty.
pub struct Redis {
    child: Child,
    pub port: u16,
}

impl Redis {
    pub fn start() -> Redis {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        Redis::on(port)
    }

    pub fn on(port: u16) -> Redis {
        let bin = std::env::var("RETRYWISE_REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
        let child = Command::new(&bin)
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot run {bin} ({e}): install Debian's redis-server (scripts/test-all does)")
            });
        let r = Redis { child, port };
        // Wait for it to listen (startup, not behaviour: no assertion on time).
        let client = redis::Client::open(r.url()).unwrap();
        for _ in 0..400 {
            let up = client
                .get_connection_with_timeout(Duration::from_millis(100))
                .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c));
            if up.is_ok() {
                return r;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        panic!("redis-server did not start on port {port}");
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
    }
}
