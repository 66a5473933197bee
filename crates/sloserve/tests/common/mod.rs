//! A `sloserve serve` child on the default model for this crate's tests: started
//! on a free loopback port with the caller's flags, ready before it is returned,
//! killed on drop; one HTTP/1.0 exchange at a time.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub struct Server {
    pub child: Child,
    pub addr: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// `sloserve serve --model <default> --port <free> FLAGS`, once `/ready` answers 200.
    pub fn start(flags: &[&str]) -> Server {
        let model = root().join(sloserve_model::DEFAULT_MODEL_PATH);
        assert!(
            model.exists(),
            "{} is missing: run `make model`",
            model.display()
        );
        // A free port: bind :0, read it, release it for the server.
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(env!("CARGO_BIN_EXE_sloserve"))
            .args(["serve", "--model", model.to_str().unwrap()])
            .args(["--port", &port.to_string()])
            .args(flags)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("sloserve serve starts");
        let s = Server {
            child,
            addr: format!("127.0.0.1:{port}"),
        };
        let t0 = Instant::now();
        while s.http("GET", "/ready", "", None).0 != 200 {
            assert!(
                t0.elapsed() < Duration::from_secs(120),
                "server not ready in 120 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        s
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// One HTTP/1.0 exchange (the server closes the connection): (status, body);
    /// status 0 when not reachable.
    pub fn http(&self, method: &str, path: &str, body: &str, key: Option<&str>) -> (u16, String) {
        let Ok(mut s) = TcpStream::connect(&self.addr) else {
            return (0, String::new());
        };
        let auth = key.map_or(String::new(), |k| format!("Authorization: Bearer {k}\r\n"));
        let req = format!(
            "{method} {path} HTTP/1.0\r\nHost: {}\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            self.addr,
            body.len()
        );
        if s.write_all(req.as_bytes()).is_err() {
            return (0, String::new());
        }
        let mut text = String::new();
        if s.read_to_string(&mut text).is_err() {
            return (0, String::new());
        }
        let status = text
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string());
        (status, body.unwrap_or_default())
    }

    pub fn get(&self, path: &str) -> (u16, String) {
        self.http("GET", path, "", None)
    }
}
