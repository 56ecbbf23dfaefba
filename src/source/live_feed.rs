//! A live stream read on a thread of its own, so a dashboard or the agent only ever takes what
//! has already arrived and never waits on a slow or silent process. Tests feed one by hand.

use super::live::{LiveClient, LiveError, LiveEvent};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::sync::mpsc::{channel, Receiver, Sender, TryRecvError};
use std::time::Duration;

/// One thing read from the stream, or why reading stopped.
pub type FeedItem = Result<LiveEvent, String>;

/// Whether more may come.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FeedState {
    Open,
    /// The reader stopped: the stream ended, closed or failed.
    Closed,
}

/// The receiving end of a live stream read in the background.
pub struct LiveFeed {
    items: Receiver<FeedItem>,
    /// Shuts the connection down when the feed is dropped, which ends the reader thread.
    stop: Option<UnixStream>,
}

impl LiveFeed {
    /// Reads `client` on a new thread until its stream ends or the feed is dropped.
    pub fn start(mut client: LiveClient) -> Result<LiveFeed, LiveError> {
        let stop = client.stopper()?;
        let (send, items) = channel();
        std::thread::Builder::new()
            .name("memprof-live".into())
            .spawn(move || loop {
                let item = match client.next_event() {
                    Ok(Some(event)) => Ok(event),
                    Ok(None) => return,
                    Err(e) => Err(e.to_string()),
                };
                let failed = item.is_err();
                if send.send(item).is_err() || failed {
                    return;
                }
            })
            .map_err(LiveError::Read)?;
        Ok(LiveFeed {
            items,
            stop: Some(stop),
        })
    }

    /// A feed the caller writes to (tests and demos); dropping the sender closes it.
    pub fn manual() -> (Sender<FeedItem>, LiveFeed) {
        let (send, items) = channel();
        (send, LiveFeed { items, stop: None })
    }

    /// The next item, waiting at most `timeout` for it; `None` when none came or the feed is
    /// closed.
    pub fn next_within(&self, timeout: Duration) -> Option<FeedItem> {
        self.items.recv_timeout(timeout).ok()
    }

    /// Hands at most `max` items that have arrived to `take`, without waiting.
    pub fn drain(&self, max: usize, mut take: impl FnMut(FeedItem)) -> FeedState {
        for _ in 0..max {
            match self.items.try_recv() {
                Ok(item) => take(item),
                Err(TryRecvError::Empty) => return FeedState::Open,
                Err(TryRecvError::Disconnected) => return FeedState::Closed,
            }
        }
        FeedState::Open
    }
}

impl Drop for LiveFeed {
    fn drop(&mut self) {
        if let Some(stream) = &self.stop {
            // Already closed by the other side is fine: the reader is ending anyway.
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}
