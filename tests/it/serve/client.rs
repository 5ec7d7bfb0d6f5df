//! A served binary and a minimal HTTP/1.1 client: enough to send a completions request, read
//! an answer (whole, or server-sent events over chunked transfer), scrape `/metrics`, and hang
//! up mid-stream.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Every wait in these tests ends: a server that stops answering fails the test, never hangs it.
pub const DEADLINE: Duration = Duration::from_secs(120);

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `kvbench serve` on a free port, killed if the test ends without stopping it.
pub struct Served {
    child: Option<Child>,
    pub addr: String,
    pub out: PathBuf,
    stderr: Option<std::process::ChildStderr>,
}

impl Served {
    pub fn start(scenario: &str, out: &Path, extra: &[&str]) -> Served {
        let mut child = Command::new(env!("CARGO_BIN_EXE_kvbench"))
            .current_dir(repo())
            .arg("serve")
            .arg(scenario)
            .args(["--port", "0", "--out"])
            .arg(out)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn kvbench serve");
        let stdout = child.stdout.take().expect("stdout");
        let stderr = child.stderr.take();
        let mut lines = BufReader::new(stdout);
        let mut line = String::new();
        lines.read_line(&mut line).expect("read the first line");
        let Some(addr) = line.trim().strip_prefix("listening on http://") else {
            let _ = child.kill();
            let mut err = String::new();
            if let Some(mut e) = stderr {
                let _ = e.read_to_string(&mut err);
            }
            panic!("expected `listening on http://...`, got {line:?}; stderr: {err}")
        };
        let addr = addr.to_string();
        // The rest of stdout is drained so the server never blocks on a full pipe.
        std::thread::spawn(move || {
            let mut sink = String::new();
            let _ = lines.read_to_string(&mut sink);
        });
        Served {
            child: Some(child),
            addr,
            out: out.to_path_buf(),
            stderr,
        }
    }

    /// SIGTERM, then wait for the exit (bounded); returns its code and stderr.
    pub fn stop(&mut self) -> (Option<i32>, String) {
        let mut child = self.child.take().expect("running");
        // SAFETY: signalling our own child by its pid.
        unsafe {
            libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
        }
        let t0 = Instant::now();
        let status = loop {
            if let Some(s) = child.try_wait().expect("wait") {
                break s;
            }
            if t0.elapsed() > DEADLINE {
                let _ = child.kill();
                panic!("kvbench serve still running {DEADLINE:?} after SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut err = String::new();
        if let Some(mut e) = self.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        (status.code(), err)
    }

    pub fn summary(&self) -> serde_json::Value {
        let text = std::fs::read_to_string(self.out.join("summary.json")).expect("summary.json");
        serde_json::from_str(&text).expect("summary.json parses")
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// An HTTP answer.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: String,
    pub body: String,
}

fn connect(addr: &str) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(DEADLINE)).expect("timeout");
    s
}

/// Send `method path` with `body` and `Connection: close`.
pub fn send(addr: &str, method: &str, path: &str, body: &[u8]) -> TcpStream {
    let mut s = connect(addr);
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).expect("write head");
    // A peer that refuses the body early (413) may close before it is all written.
    let _ = s.write_all(body);
    s
}

/// Read a whole answer, de-chunking a chunked body.
pub fn read_answer(s: TcpStream) -> Answer {
    let mut r = BufReader::new(s);
    let mut status_line = String::new();
    r.read_line(&mut status_line).expect("status line");
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
    let mut headers = String::new();
    loop {
        let mut l = String::new();
        r.read_line(&mut l).expect("header");
        if l == "\r\n" || l.is_empty() {
            break;
        }
        headers.push_str(&l.to_ascii_lowercase());
    }
    let mut body = Vec::new();
    if headers.contains("transfer-encoding: chunked") {
        loop {
            let mut size = String::new();
            r.read_line(&mut size).expect("chunk size");
            let n = usize::from_str_radix(size.trim(), 16).expect("hex chunk size");
            let mut chunk = vec![0; n + 2];
            r.read_exact(&mut chunk).expect("chunk");
            if n == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..n]);
        }
    } else {
        r.read_to_end(&mut body).expect("body");
    }
    Answer {
        status,
        headers,
        body: String::from_utf8(body).expect("utf-8 body"),
    }
}

pub fn request(addr: &str, method: &str, path: &str, body: &[u8]) -> Answer {
    read_answer(send(addr, method, path, body))
}

/// Per choice, the token ids of a completions answer (streamed or whole), and its finish
/// reasons.
pub fn tokens_of(a: &Answer, samples: usize) -> (Vec<Vec<u32>>, Vec<String>) {
    let mut tokens = vec![Vec::new(); samples];
    let mut finish = vec![String::new(); samples];
    let mut take = |v: &serde_json::Value| {
        for c in v["choices"].as_array().expect("choices") {
            let i = c["index"].as_u64().expect("index") as usize;
            for t in c["token_ids"].as_array().expect("token_ids") {
                tokens[i].push(t.as_u64().expect("id") as u32);
            }
            if let Some(f) = c["finish_reason"].as_str() {
                finish[i] = f.to_string();
            }
        }
    };
    if a.headers.contains("text/event-stream") {
        assert!(
            a.body.ends_with("data: [DONE]\n\n"),
            "a stream ends with [DONE]: {}",
            a.body
        );
        for event in a.body.split("\n\n").filter(|e| !e.is_empty()) {
            let data = event.strip_prefix("data: ").expect("a data event");
            if data != "[DONE]" {
                take(&serde_json::from_str(data).expect("event JSON"));
            }
        }
    } else {
        take(&serde_json::from_str(&a.body).expect("answer JSON"));
    }
    (tokens, finish)
}

/// `/metrics` as (name with labels, value) pairs.
pub fn metrics(addr: &str) -> Vec<(String, f64)> {
    let a = request(addr, "GET", "/metrics", b"");
    assert_eq!(a.status, 200);
    a.body
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').expect("sample line");
            (k.to_string(), v.parse().expect("value"))
        })
        .collect()
}

pub fn metric(m: &[(String, f64)], name: &str) -> f64 {
    m.iter()
        .find(|(k, _)| k.split('{').next() == Some(name))
        .map(|(_, v)| *v)
        .unwrap_or_else(|| panic!("no {name} in /metrics"))
}
