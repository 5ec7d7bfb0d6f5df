//! HTTP/1.1 over one TCP connection per request (hyper's client connection, no pool): a stream
//! closed early closes its connection, which is how a client cancels a request on an
//! OpenAI-compatible server. Plain GETs (`/v1/models`, `/metrics`, `/health`) read a body up to
//! a cap and within a deadline.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

use super::url::BaseUrl;

/// An open connection: the sender, and the task driving the connection (aborted to close it).
pub struct Conn {
    pub sender: SendRequest<Full<Bytes>>,
    pub driver: JoinHandle<()>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

/// Connect within `timeout`; the error is a sentence naming the address.
pub async fn connect(base: &BaseUrl, timeout: Duration) -> Result<Conn, String> {
    let addr = base.authority();
    let stream = match tokio::time::timeout(timeout, TcpStream::connect(&addr)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Err(format!("cannot connect to {addr}: {e}")),
        Err(_) => {
            return Err(format!(
                "cannot connect to {addr}: no answer within {:.1} s",
                timeout.as_secs_f64()
            ))
        }
    };
    let _ = stream.set_nodelay(true);
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("HTTP handshake with {addr}: {e}"))?;
    let driver = tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(Conn { sender, driver })
}

pub fn request(
    base: &BaseUrl,
    method: &str,
    path: &str,
    body: Option<Vec<u8>>,
) -> Result<hyper::Request<Full<Bytes>>, String> {
    let mut b = hyper::Request::builder()
        .method(method)
        .uri(base.path(path))
        .header(hyper::header::HOST, base.authority())
        .header(
            hyper::header::USER_AGENT,
            concat!("kvbench/", env!("CARGO_PKG_VERSION")),
        );
    if body.is_some() {
        b = b.header(hyper::header::CONTENT_TYPE, "application/json");
    }
    b.body(Full::new(Bytes::from(body.unwrap_or_default())))
        .map_err(|e| format!("{}: cannot build the request: {e}", base.path(path)))
}

/// GET `path`: the status and at most `cap` bytes of body, within `timeout` in all.
pub async fn get(
    base: &BaseUrl,
    path: &str,
    timeout: Duration,
    cap: usize,
) -> Result<(u16, Vec<u8>), String> {
    let url = format!("{}{}", base.text.trim_end_matches('/'), path);
    let fut = async {
        let mut conn = connect(base, timeout).await?;
        let req = request(base, "GET", path, None)?;
        let resp = conn
            .sender
            .send_request(req)
            .await
            .map_err(|e| format!("GET {url}: {e}"))?;
        let status = resp.status().as_u16();
        let body = read_capped(resp.into_body(), cap)
            .await
            .map_err(|e| format!("GET {url}: {e}"))?;
        Ok::<_, String>((status, body))
    };
    match tokio::time::timeout(timeout, fut).await {
        Ok(r) => r,
        Err(_) => Err(format!(
            "GET {url}: no complete answer within {:.1} s",
            timeout.as_secs_f64()
        )),
    }
}

/// A body read whole, refused past `cap` bytes.
pub async fn read_capped(mut body: hyper::body::Incoming, cap: usize) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| format!("reading the answer: {e}"))?;
        if let Some(d) = frame.data_ref() {
            if out.len() + d.len() > cap {
                return Err(format!("an answer over {cap} bytes (the client's cap)"));
            }
            out.extend_from_slice(d);
        }
    }
    Ok(out)
}
