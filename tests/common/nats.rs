//! A real `nats-server` (installed by `tools/setup.sh`) for the tests that replicate.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A JetStream server on a free loopback port, keeping its data in `dir`; killed (-9)
/// on drop.
pub struct Nats {
    child: Child,
    /// The port it listens on (to restart it on the same one).
    pub port: u16,
}

impl Nats {
    /// Starts a server on `port`, or on one the server picks itself: a port found free by
    /// the test could be taken by another test's server before this one binds it, and
    /// two tests sharing one server (and one stream) fail each other.
    pub fn start(dir: &Path, port: Option<u16>) -> Nats {
        let ports_dir = dir.with_extension("ports");
        std::fs::create_dir_all(&ports_dir).unwrap();
        let mut child = Command::new("nats-server")
            .args(["-js", "-a", "127.0.0.1", "-p"])
            .arg(port.map_or("-1".to_string(), |p| p.to_string()))
            .arg("--ports_file_dir")
            .arg(&ports_dir)
            .arg("-sd")
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nats-server is not installed: run tools/setup.sh");
        let ports_file = ports_dir.join(format!("nats-server_{}.ports", child.id()));
        let t = Instant::now();
        let port = loop {
            if let Some(status) = child.try_wait().unwrap() {
                panic!("nats-server exited ({status}) before it listened");
            }
            let listening = std::fs::read(&ports_file)
                .ok()
                .and_then(|bytes| serde_json::from_slice::<serde_json::Value>(&bytes).ok())
                .and_then(|ports| {
                    let url = ports["nats"][0].as_str()?.to_string();
                    url.rsplit(':').next()?.parse::<u16>().ok()
                });
            if let Some(port) = listening
                && std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
            {
                break port;
            }
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "nats-server did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        Nats { child, port }
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Run `f` on the server's JetStream as a client of the test's own, to look at or
    /// change the stream and the bucket behind the replicas' backs.
    pub fn jetstream<T>(&self, f: impl AsyncFnOnce(async_nats::jetstream::Context) -> T) -> T {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let client = async_nats::connect(self.url()).await.unwrap();
            f(async_nats::jetstream::new(client)).await
        })
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
