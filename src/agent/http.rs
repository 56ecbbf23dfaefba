//! The agent's HTTP server (tiny_http): `GET /metrics` answers the cached exposition, `GET /`
//! a pointer to it; anything else is 404 or 405. A few workers answer, so one client that reads
//! its answer slowly does not hold up the others (tiny_http reads requests on its own threads).

use super::Cache;
use crate::report::prometheus::CONTENT_TYPE;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tiny_http::{Header, Method, Request, Response, Server};

/// The server could not start.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("cannot listen on {addr}: {message}")]
    Bind { addr: String, message: String },
}

/// Threads answering requests.
const WORKERS: usize = 4;

/// A bound server answering from a cache.
pub struct Exporter {
    server: Arc<Server>,
    cache: Arc<Cache>,
    stopping: Arc<AtomicBool>,
}

impl Exporter {
    /// Listens on `addr` (`host:port`; port 0 picks a free one).
    pub fn bind(addr: &str, cache: Arc<Cache>) -> Result<Self, HttpError> {
        let server = Server::http(addr).map_err(|e| HttpError::Bind {
            addr: addr.to_owned(),
            message: e.to_string(),
        })?;
        Ok(Self {
            server: Arc::new(server),
            cache,
            stopping: Arc::new(AtomicBool::new(false)),
        })
    }

    /// The address actually bound (the port chosen for port 0).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.server.server_addr().to_ip()
    }

    /// A handle that stops `serve` from another thread.
    pub fn stopper(&self) -> impl Fn() + Send + 'static {
        let server = Arc::clone(&self.server);
        let stopping = Arc::clone(&self.stopping);
        move || {
            stopping.store(true, Ordering::SeqCst);
            // Each unblock wakes one waiting worker.
            for _ in 0..WORKERS {
                server.unblock();
            }
        }
    }

    /// Answers requests until stopped; each answer is a copy of the cache.
    pub fn serve(&self) {
        std::thread::scope(|scope| {
            for _ in 0..WORKERS {
                scope.spawn(|| loop {
                    match self.server.recv() {
                        Ok(request) => self.answer(request),
                        // Woken by the stopper, or a failed accept (carry on).
                        Err(_) if self.stopping.load(Ordering::SeqCst) => return,
                        Err(_) => {}
                    }
                });
            }
        });
    }

    fn answer(&self, request: Request) {
        let path = request.url().split('?').next().unwrap_or_default();
        let result = match (request.method(), path) {
            (Method::Get | Method::Head, "/metrics") => {
                let text = self.cache.latest();
                if text.is_empty() {
                    // No GPU sample has succeeded yet: no figures rather than made-up ones.
                    request.respond(
                        Response::from_string("memprof agent: no GPU sample yet\n")
                            .with_status_code(503),
                    )
                } else {
                    request.respond(with_type(
                        Response::from_string(text.as_str()),
                        CONTENT_TYPE,
                    ))
                }
            }
            (Method::Get | Method::Head, "/") => request.respond(with_type(
                Response::from_string("memprof agent: metrics at /metrics\n"),
                "text/plain; charset=utf-8",
            )),
            (Method::Get | Method::Head, _) => {
                request.respond(Response::from_string("not found\n").with_status_code(404))
            }
            _ => {
                request.respond(Response::from_string("only GET and HEAD\n").with_status_code(405))
            }
        };
        // A client that hung up mid-answer is its own problem; the server carries on.
        drop(result);
    }
}

/// Sets the Content-Type (the values here are constant ASCII, which tiny_http always accepts).
fn with_type<R: std::io::Read>(mut response: Response<R>, content_type: &str) -> Response<R> {
    if let Ok(header) = Header::from_bytes(&b"Content-Type"[..], content_type.as_bytes()) {
        response.add_header(header);
    }
    response
}
