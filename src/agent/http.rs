//! The agent's HTTP server: `GET /metrics` answers the cached exposition, `GET /` a pointer to
//! it; anything else is 404 or 405, and any request that carries a body 413. It stays up and
//! keeps answering scrapes whatever the other clients on the network do (see `limits_help`).
//!
//! Why hyper (HTTP/1 only) on a one-thread tokio runtime: tiny_http, used before, spawned a
//! thread per connection, had no timeout and read any announced body into memory, so one
//! request could abort the agent and a few idle clients stopped every scrape. hyper's
//! connection parses the request head within a fixed buffer (`MAX_REQUEST_HEAD`), cuts a client
//! that takes too long to send it (`HEADER_TIMEOUT`), and reads no body unless asked to (we
//! never ask). Every connection is a task on the one thread that runs `serve`, so the thread
//! count does not depend on the clients. What hyper leaves to its user is here: a write timeout
//! (`Guarded`: a client that stops taking its answers is cut) and a cap on open connections
//! (`MAX_CONNECTIONS`: at the cap the connection idle the longest is closed, so a new scraper is
//! always let in).

use super::Cache;
use crate::model::Bytes;
use crate::report::prometheus::CONTENT_TYPE;
use http_body_util::Full;
use hyper::header::{HeaderValue, ALLOW, CONNECTION};
use hyper::server::conn::http1;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::Notify;
use tokio::task::{AbortHandle, Id, JoinSet};

/// Time a client has to send a whole request head, counted from when the connection opens or
/// its previous answer went out (so it is also how long an idle connection is kept).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// Time a client has to take an answer once writing it has stalled (its reading stopped).
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections open at once; at the cap, the one idle the longest is closed for a new one.
pub const MAX_CONNECTIONS: usize = 256;
/// Largest request head (request line and headers) and read buffer of a connection; hyper
/// answers 431 (or 414 for the URI) past it. hyper's own floor is 8 KiB.
pub const MAX_REQUEST_HEAD: usize = 16 << 10;
/// Most header lines in a request (hyper answers 431 past it).
pub const MAX_HEADERS: usize = 64;

/// The limits above, for `memprof agent --help`.
pub fn limits_help() -> String {
    format!(
        "Limits (the agent may face any client that can reach --listen):\n  \
         A request head (request line and headers) of at most {head} and {MAX_HEADERS} header \
         lines; no request body (413).\n  \
         {header} s to send a request head, from connecting or from the previous answer (so an \
         idle connection is closed after {header} s).\n  \
         {write} s for a client that stopped reading to take the rest of its answer, then it \
         is cut.\n  \
         {MAX_CONNECTIONS} connections at once; past that, each new one closes the connection \
         idle the longest.\n  \
         One thread serves every connection.",
        head = Bytes(MAX_REQUEST_HEAD as u64),
        header = HEADER_TIMEOUT.as_secs(),
        write = WRITE_TIMEOUT.as_secs(),
    )
}

/// The server could not start.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("cannot listen on {addr}: {message}")]
    Bind { addr: String, message: String },
    #[error("cannot start the HTTP server: {0}")]
    Runtime(String),
}

/// A bound server answering from a cache.
pub struct Exporter {
    runtime: tokio::runtime::Runtime,
    listener: tokio::net::TcpListener,
    cache: Arc<Cache>,
    stop: Arc<Notify>,
}

impl Exporter {
    /// Listens on `addr` (`host:port`; port 0 picks a free one).
    pub fn bind(addr: &str, cache: Arc<Cache>) -> Result<Self, HttpError> {
        let bind_error = |e: io::Error| HttpError::Bind {
            addr: addr.to_owned(),
            message: e.to_string(),
        };
        // Bound here (std, no runtime needed) so a bad address is an error before `serve`.
        let listener = std::net::TcpListener::bind(addr).map_err(bind_error)?;
        listener.set_nonblocking(true).map_err(bind_error)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(|e| HttpError::Runtime(e.to_string()))?;
        let listener = {
            let _inside = runtime.enter();
            tokio::net::TcpListener::from_std(listener).map_err(bind_error)?
        };
        Ok(Self {
            runtime,
            listener,
            cache,
            stop: Arc::new(Notify::new()),
        })
    }

    /// The address actually bound (the port chosen for port 0).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.listener.local_addr().ok()
    }

    /// A handle that stops `serve` from another thread (also when called before `serve`).
    pub fn stopper(&self) -> impl Fn() + Send + 'static {
        let stop = Arc::clone(&self.stop);
        move || stop.notify_one()
    }

    /// Answers requests on the calling thread until stopped; each answer shares the cache's
    /// text. Open connections are closed when it returns.
    pub fn serve(&self) {
        self.runtime.block_on(self.accept_loop());
    }

    async fn accept_loop(&self) {
        let started = Instant::now();
        let mut tasks = JoinSet::new();
        // The open connections, with when each last moved a byte (for choosing which to close).
        let mut open: HashMap<Id, (Arc<AtomicU64>, AbortHandle)> = HashMap::new();
        loop {
            let accepted = tokio::select! {
                () = self.stop.notified() => return,
                accepted = self.listener.accept() => accepted,
            };
            let stream = match accepted {
                Ok((stream, _)) => stream,
                // Out of file descriptors, or a connection reset before it was taken: the
                // others stay queued; try again shortly.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            };
            while let Some(done) = tasks.try_join_next_with_id() {
                open.remove(&done.map_or_else(|e| e.id(), |(id, ())| id));
            }
            if open.len() >= MAX_CONNECTIONS {
                let idlest = open
                    .iter()
                    .min_by_key(|(_, (moved, _))| moved.load(Ordering::Relaxed))
                    .map(|(id, _)| *id);
                if let Some((_, task)) = idlest.and_then(|id| open.remove(&id)) {
                    task.abort();
                }
            }
            // Answers are written whole, at once; no need to wait for more to send.
            let _ = stream.set_nodelay(true);
            let moved = Arc::new(AtomicU64::new(0));
            let io = Guarded::new(stream, started, Arc::clone(&moved));
            let task = tasks.spawn(serve_connection(io, Arc::clone(&self.cache)));
            open.insert(task.id(), (moved, task));
        }
    }
}

/// Serves one connection (the same for the network and for `answer_bytes`) until the client
/// closes it or a limit cuts it.
async fn serve_connection<S>(io: Guarded<S>, cache: Arc<Cache>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
        let response = answer(&cache, &request);
        async move { Ok::<_, Infallible>(response) }
    });
    let served = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .max_buf_size(MAX_REQUEST_HEAD)
        .max_headers(MAX_HEADERS)
        // A client that closes its sending side after its requests still gets the answers.
        .half_close(true)
        .serve_connection(TokioIo::new(io), service)
        .await;
    // A bad request, a timeout or a client gone is that client's business: hyper has answered
    // what could be answered (400, 408, 431) and the connection is closed.
    drop(served);
}

/// A response body sharing the cache's text (no copy per scrape).
struct Shared(Arc<String>);

impl AsRef<[u8]> for Shared {
    fn as_ref(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

type Answer = Response<Full<bytes::Bytes>>;

fn answer<B: hyper::body::Body>(cache: &Cache, request: &Request<B>) -> Answer {
    // Nothing here takes a body; refusing it unread also keeps its bytes out of memory (hyper
    // closes the connection rather than read what is left of an unread body).
    if !request.body().is_end_stream() {
        let mut response = text(
            StatusCode::PAYLOAD_TOO_LARGE,
            "memprof agent: requests with a body are not accepted\n",
        );
        response
            .headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
        return response;
    }
    if !matches!(*request.method(), Method::GET | Method::HEAD) {
        let mut response = text(StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD\n");
        response
            .headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return response;
    }
    match request.uri().path() {
        "/metrics" => {
            let latest = cache.latest();
            if latest.is_empty() {
                // No GPU sample has succeeded yet: no figures rather than made-up ones.
                text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "memprof agent: no GPU sample yet\n",
                )
            } else {
                let body = bytes::Bytes::from_owner(Shared(latest));
                typed(StatusCode::OK, body, CONTENT_TYPE)
            }
        }
        "/" => text(StatusCode::OK, "memprof agent: metrics at /metrics\n"),
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    }
}

fn text(status: StatusCode, body: &'static str) -> Answer {
    typed(
        status,
        bytes::Bytes::from_static(body.as_bytes()),
        "text/plain; charset=utf-8",
    )
}

fn typed(status: StatusCode, body: bytes::Bytes, content_type: &'static str) -> Answer {
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static(content_type),
    );
    response
}

/// A connection's stream with the write timeout hyper does not have, and a record of when it
/// last moved a byte. A write that cannot go on arms a `WRITE_TIMEOUT` deadline, which holds
/// until everything queued is written (`poll_flush` done): a client that stops reading is cut
/// then, however slowly it drips.
struct Guarded<S> {
    inner: S,
    started: Instant,
    moved: Arc<AtomicU64>,
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S> Guarded<S> {
    fn new(inner: S, started: Instant, moved: Arc<AtomicU64>) -> Self {
        let this = Self {
            inner,
            started,
            moved,
            stalled: None,
        };
        this.touch();
        this
    }

    fn touch(&self) {
        let now = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.moved.store(now, Ordering::Relaxed);
    }

    /// Passes on a write's outcome; a write still waiting past the deadline fails instead.
    fn watch<T>(&mut self, poll: Poll<io::Result<T>>, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        match poll {
            Poll::Ready(Ok(value)) => {
                self.touch();
                Poll::Ready(Ok(value))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => {
                let deadline = self
                    .stalled
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(WRITE_TIMEOUT)));
                match deadline.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the client stopped reading its answer",
                    ))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Guarded<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let poll = Pin::new(&mut this.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            this.touch();
        }
        poll
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Guarded<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.watch(poll, cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.watch(poll, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.inner).poll_flush(cx);
        let poll = this.watch(poll, cx);
        if poll.is_ready() {
            // hyper flushes once what it queued is written: the answer is out.
            this.stalled = None;
        }
        poll
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// Feeds `input` to the server as one client's bytes (then closes the sending side) over an
/// in-memory pipe, and returns all the server wrote back: the same connection code, limits
/// and answers as for a network client. For the fuzz target and the tests. A server that has
/// not closed the connection `HEADER_TIMEOUT` after the input ended is an error (`TimedOut`).
pub fn answer_bytes(input: &[u8], cache: Arc<Cache>) -> io::Result<Vec<u8>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()?;
    runtime.block_on(async {
        let (client, server) = tokio::io::duplex(MAX_REQUEST_HEAD);
        let io = Guarded::new(server, Instant::now(), Arc::new(AtomicU64::new(0)));
        let (mut from_server, mut to_server) = tokio::io::split(client);
        let send = async {
            // The server may close before it has read everything (a refused body).
            let _ = to_server.write_all(input).await;
            let _ = to_server.shutdown().await;
        };
        let receive = async {
            let mut output = Vec::new();
            from_server.read_to_end(&mut output).await.map(|_| output)
        };
        let exchange = async {
            let ((), (), output) = tokio::join!(serve_connection(io, cache), send, receive);
            output
        };
        tokio::time::timeout(HEADER_TIMEOUT, exchange)
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "the server did not finish"))?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn served() -> Arc<Cache> {
        let cache = Arc::new(Cache::default());
        cache.store("# HELP x y\nx 1\n# EOF\n".to_owned());
        cache
    }

    fn exchange(cache: &Arc<Cache>, input: &str) -> String {
        let output = answer_bytes(input.as_bytes(), Arc::clone(cache)).expect("the server ends");
        String::from_utf8(output).expect("ASCII answers")
    }

    fn statuses(output: &str) -> Vec<&str> {
        output
            .match_indices("HTTP/1.")
            .filter_map(|(at, _)| output[at..].split(' ').nth(1))
            .collect()
    }

    #[test]
    fn routes_and_methods() {
        let cache = served();
        let metrics = exchange(&cache, "GET /metrics HTTP/1.1\r\nHost: h\r\n\r\n");
        assert!(metrics.starts_with("HTTP/1.1 200 OK\r\n"), "{metrics}");
        assert!(
            metrics.contains("content-type: application/openmetrics-text"),
            "{metrics}"
        );
        assert!(
            metrics.ends_with("\r\n\r\n# HELP x y\nx 1\n# EOF\n"),
            "{metrics}"
        );
        // HTTP/1.0 is answered in HTTP/1.0; a query string does not change the path.
        let old = exchange(&cache, "GET /metrics?x=1 HTTP/1.0\r\n\r\n");
        assert!(old.starts_with("HTTP/1.0 200 OK\r\n"), "{old}");
        let head = exchange(&cache, "HEAD /metrics HTTP/1.1\r\nHost: h\r\n\r\n");
        let length = format!("content-length: {}\r\n", cache.latest().len());
        assert!(head.contains(&length), "{head}");
        assert!(
            head.ends_with("\r\n\r\n"),
            "a HEAD answer has no body: {head}"
        );
        let root = exchange(&cache, "GET / HTTP/1.1\r\nHost: h\r\n\r\n");
        assert!(root.ends_with("metrics at /metrics\n"), "{root}");
        assert_eq!(
            statuses(&exchange(&cache, "GET /x HTTP/1.1\r\nHost: h\r\n\r\n")),
            ["404"]
        );
        let post = exchange(&cache, "POST /metrics HTTP/1.1\r\nHost: h\r\n\r\n");
        assert!(post.starts_with("HTTP/1.1 405"), "{post}");
        assert!(post.contains("allow: GET, HEAD\r\n"), "{post}");
        let empty = exchange(&Arc::new(Cache::default()), "GET /metrics HTTP/1.0\r\n\r\n");
        assert!(empty.starts_with("HTTP/1.0 503"), "{empty}");
    }

    #[test]
    fn a_body_is_refused_unread_and_the_connection_closed() {
        let cache = served();
        // The second request is never answered: the connection closes after the 413.
        let output = exchange(
            &cache,
            "GET /metrics HTTP/1.1\r\nHost: h\r\nContent-Length: 99999999999\r\n\r\nabc\
             GET /metrics HTTP/1.1\r\nHost: h\r\n\r\n",
        );
        assert_eq!(statuses(&output), ["413"], "{output}");
        assert!(output.contains("connection: close\r\n"), "{output}");
        let chunked = exchange(
            &cache,
            "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n",
        );
        assert_eq!(statuses(&chunked), ["413"], "{chunked}");
    }

    #[test]
    fn pipelined_requests_are_answered_in_order() {
        let cache = served();
        let output = exchange(
            &cache,
            "GET /metrics HTTP/1.1\r\nHost: h\r\n\r\nGET /nope HTTP/1.1\r\nHost: h\r\n\r\n\
             HEAD / HTTP/1.1\r\nHost: h\r\n\r\n",
        );
        assert_eq!(statuses(&output), ["200", "404", "200"], "{output}");
    }

    #[test]
    fn an_oversized_or_broken_head_is_refused() {
        let cache = served();
        let long_header = format!(
            "GET /metrics HTTP/1.1\r\nHost: h\r\nX-Big: {}\r\n\r\n",
            "a".repeat(MAX_REQUEST_HEAD)
        );
        assert_eq!(statuses(&exchange(&cache, &long_header)), ["431"]);
        let many: String = (0..=MAX_HEADERS).map(|i| format!("X-{i}: v\r\n")).collect();
        let many = format!("GET /metrics HTTP/1.1\r\n{many}\r\n");
        assert_eq!(statuses(&exchange(&cache, &many)), ["431"]);
        assert_eq!(statuses(&exchange(&cache, "NOT HTTP\r\n\r\n")), ["400"]);
        // A head cut short by the client: nothing to answer, and no wait for the timeout.
        let start = Instant::now();
        let cut = exchange(&cache, "GET /metrics HTTP/1.1\r\nHost:");
        assert!(start.elapsed() < Duration::from_secs(1));
        assert!(statuses(&cut).iter().all(|s| *s == "400"), "{cut}");
    }

    #[test]
    fn the_help_states_the_limits() {
        let help = limits_help();
        assert!(
            help.contains("at most 16.00 KiB and 64 header lines"),
            "{help}"
        );
        assert!(help.contains("5 s to send a request head"), "{help}");
        assert!(
            help.contains("10 s for a client that stopped reading"),
            "{help}"
        );
        assert!(help.contains("256 connections at once"), "{help}");
    }
}
