//! The endpoint client as a load generator: against a server that answers at once, how close it
//! keeps an open-loop schedule (p99 scheduling lag at 1,000 requests/s), and what 1,000
//! concurrent streams cost it (peak resident memory).
//!
//! `cargo bench --bench endpoint` (release build; about 20 s). The client runs pinned to two
//! cores with two runtime threads; the server is this binary again (`--serve`), a separate
//! process pinned to the other cores, so its memory and CPU are not the client's. Prints one
//! line per phase: requests, achieved rate, lag p50/p99/max, peak streams in flight, and the
//! client process's peak RSS (VmHWM) after the phase.

use std::future::Future;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming};
use hyper::{Request, Response};

const TOKENS: u32 = 16;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--serve") {
        serve();
        return;
    }
    if !args.iter().any(|a| a == "--bench") {
        // `cargo test --all-targets` runs benches without `--bench`: a load test is no unit test.
        println!("endpoint bench: run it with `cargo bench --bench endpoint`");
        return;
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut child = Command::new(std::env::current_exe().unwrap())
        .arg("--serve")
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the server process");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port: u16 = line.trim().parse().expect("the server's port");
    if cores >= 4 {
        pin(&[0, 1]);
        pin_pid(child.id(), &(2..cores).collect::<Vec<_>>());
    } else {
        eprintln!("note: {cores} cores: client and server share them");
    }
    let url = format!("http://127.0.0.1:{port}");
    let dir = tempfile::tempdir().unwrap();
    // Phase 1: instant answers, 1,000 requests/s for 10 s.
    phase(
        &url,
        dir.path(),
        "rate 1000/s, instant answers",
        10_000,
        "instant",
    );
    // Phase 2: every stream held for 1 s (a token every 62.5 ms): ~1,000 in flight.
    phase(
        &url,
        dir.path(),
        "1000 concurrent streams (1 s each)",
        5_000,
        "slow",
    );
    let _ = child.kill();
    let _ = child.wait();
}

fn phase(url: &str, dir: &Path, what: &str, requests: u32, model: &str) {
    let scenario = dir.join(format!("{model}.toml"));
    std::fs::write(
        &scenario,
        format!(
            "name = \"endpoint-bench-{model}\"\nseed = 1\ndevice = \"cpu\"\n[model]\npreset = \"tiny\"\n\
             [memory]\nkv_budget = \"64 MiB\"\n[cache]\nblock_size = 16\nmax_seq_len = 256\n\
             [traffic]\nrequests = {requests}\n[traffic.arrival]\nkind = \"poisson\"\nrate_per_s = 1000.0\n\
             [traffic.prompt_tokens]\ndist = \"uniform\"\nmin = 16\nmax = 64\n\
             [traffic.output_tokens]\ndist = \"fixed\"\nvalue = {TOKENS}\n"
        ),
    )
    .unwrap();
    let s = kvbench::scenario::load(&scenario, &[]).expect("the bench scenario");
    let mut o = kvbench::endpoint::EndpointOptions::new(url);
    o.model = Some(model.into());
    o.worker_threads = Some(2);
    o.trace_tokens = false;
    let out = dir.join(model);
    let r = kvbench::endpoint::run(&s, &o, &out, false).expect("the bench run");
    let e = &r.summary.endpoint;
    let peak = e
        .server_metrics
        .as_ref()
        .and_then(|m| m.peak_requests_running)
        .unwrap_or(0.0);
    println!(
        "{what}: {} requests ({} completed), achieved {:.1}/s of {:.1}/s offered, lag p50 {:.3} ms p99 {:.3} ms max {:.3} ms,{} client peak RSS {} MB{}",
        e.requests_sent,
        r.summary.runs[0].requests.completed,
        e.achieved_rate_per_s.unwrap_or(0.0),
        e.offered_rate_per_s.unwrap_or(0.0),
        e.lag_ms.p50,
        e.lag_ms.p99,
        e.lag_ms.max,
        if peak > 0.0 {
            format!(" {peak:.0} streams open at most (server's count),")
        } else {
            String::new()
        },
        vm_hwm_kb() / 1024,
        if r.summary.checks.ok { String::new() } else { format!(" (checks: {:?})", r.summary.checks.failures) }
    );
    let _ = std::io::stdout().flush();
}

fn vm_hwm_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn pin(cpus: &[usize]) {
    pin_pid(0, cpus);
}

fn pin_pid(pid: u32, cpus: &[usize]) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes within it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cpus {
            libc::CPU_SET(c, &mut set);
        }
        libc::sched_setaffinity(pid as i32, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// The server: answers every completion with `TOKENS` tokens, at once (model `instant`) or a
/// token every 62.5 ms (model `slow`); `/metrics` says how many streams are open.
fn serve() {
    static RUNNING: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);
    static PEAK: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        println!("{}", l.local_addr().unwrap().port());
        let _ = std::io::stdout().flush();
        loop {
            let Ok((tcp, _)) = l.accept().await else { continue };
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(|req: Request<Incoming>| async move {
                    let path = req.uri().path().to_string();
                    let body = match path.as_str() {
                        "/v1/models" => Either::Full(
                            "{\"object\":\"list\",\"data\":[{\"id\":\"instant\"},{\"id\":\"slow\"}]}".into(),
                        ),
                        "/metrics" => {
                            let peak = PEAK.swap(RUNNING.load(std::sync::atomic::Ordering::SeqCst), std::sync::atomic::Ordering::SeqCst);
                            Either::Full(format!("vllm:num_requests_running {peak}\n"))
                        }
                        _ => {
                            let b = req.into_body().collect().await.unwrap().to_bytes();
                            let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
                            let slow = v["model"] == "slow";
                            let n = v["max_tokens"].as_u64().unwrap_or(1);
                            let event = move |i: u64| format!(
                                "data: {{\"choices\":[{{\"index\":0,\"text\":\" t\",\"token_ids\":[{i}],\"finish_reason\":{}}}]}}\n\n",
                                if i + 1 == n { "\"length\"" } else { "null" }
                            );
                            if slow {
                                Either::Slow(SlowBody::new(n, Box::new(event)))
                            } else {
                                let mut s: String = (0..n).map(event).collect();
                                s.push_str("data: [DONE]\n\n");
                                Either::Full(s)
                            }
                        }
                    };
                    Ok::<_, std::convert::Infallible>(Response::new(body))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });

    enum Either {
        Full(String),
        Slow(SlowBody),
    }
    struct SlowBody {
        left: u64,
        n: u64,
        event: Box<dyn Fn(u64) -> String + Send>,
        sleep: std::pin::Pin<Box<tokio::time::Sleep>>,
        done: bool,
    }
    impl SlowBody {
        fn new(n: u64, event: Box<dyn Fn(u64) -> String + Send>) -> SlowBody {
            let v = RUNNING.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            PEAK.fetch_max(v, std::sync::atomic::Ordering::SeqCst);
            SlowBody {
                left: n,
                n,
                event,
                sleep: Box::pin(tokio::time::sleep(gap())),
                done: false,
            }
        }
    }
    impl Drop for SlowBody {
        fn drop(&mut self) {
            RUNNING.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        }
    }
    fn gap() -> Duration {
        Duration::from_micros(62_500)
    }
    impl Body for Either {
        type Data = Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            use std::task::Poll;
            match self.get_mut() {
                Either::Full(s) => {
                    if s.is_empty() {
                        return Poll::Ready(None);
                    }
                    Poll::Ready(Some(Ok(Frame::data(Bytes::from(std::mem::take(s))))))
                }
                Either::Slow(b) => {
                    if b.done {
                        return Poll::Ready(None);
                    }
                    if b.sleep.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    let i = b.n - b.left;
                    let mut s = (b.event)(i);
                    b.left -= 1;
                    if b.left == 0 {
                        s.push_str("data: [DONE]\n\n");
                        b.done = true;
                    } else {
                        let next = tokio::time::Instant::now() + gap();
                        b.sleep.as_mut().reset(next);
                    }
                    Poll::Ready(Some(Ok(Frame::data(Bytes::from(s)))))
                }
            }
        }
    }
}
