//! The TCP host transport: one connection per pair of ranks, framed messages, and a reader
//! thread per connection that drains it into this rank's mailbox, so that a send never waits
//! for the peer to receive (its writes always find a reader) and a broken link marks the peer
//! gone at once.
//!
//! A frame is the tag (u64) and the length (u64), little-endian, then the bytes. A peer's
//! header alone never makes this rank take memory: the reader grows a message with the bytes
//! that arrive, and fails the link (closing the peer's mailbox with the reason) on a length no
//! process can hold. A frame is written under one deadline, the transport's timeout; a write
//! that fails leaves the link out of frame, so it is shut down at once and never written again:
//! the peer's reader sees the link close in the middle of the message instead of taking later
//! bytes (an abort frame's, say) for the rest of it.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use cuflow_runtime::{DeviceError, HostTransport};
use parking_lot::Mutex;

use crate::mailbox::{Mailbox, ABORT_TAG, CLOSE_TAG};

/// The room a message's first bytes are read into; it then doubles with the bytes that
/// arrived, up to the length the header announced.
const FIRST_ROOM: usize = 1 << 20;

/// The longest message a process can hold (a `Vec`'s limit); a header announcing more is from
/// no cuflow rank.
const LONGEST_MESSAGE: u64 = isize::MAX as u64;

/// One rank's connections to the others.
pub(crate) struct TcpTransport {
    rank: usize,
    writers: Vec<Option<Mutex<Link>>>,
    mailbox: Arc<Mailbox>,
    timeout: Duration,
}

/// The writing end of the connection to one peer.
struct Link {
    stream: TcpStream,
    /// Why a write failed on it: the link was shut down then, and nothing more is written.
    broken: Option<String>,
    /// Why its reader stopped, once it did (it then shut the link).
    reader_stopped: Arc<OnceLock<String>>,
}

impl std::fmt::Debug for TcpTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpTransport")
            .field("rank", &self.rank)
            .field("world_size", &self.writers.len())
            .finish()
    }
}

fn link_err(rank: usize, reason: String) -> DeviceError {
    DeviceError::Collective {
        op: "connect",
        rank,
        reason,
    }
}

impl TcpTransport {
    /// The transport of rank `rank` over `peers` (a connection to every other rank).
    pub(crate) fn new(
        rank: usize,
        peers: Vec<Option<TcpStream>>,
        timeout: Duration,
    ) -> Result<TcpTransport, DeviceError> {
        let world = peers.len();
        // Built first, so that on an error its drop shuts the links already set up, which
        // ends their readers.
        let mut transport = TcpTransport {
            rank,
            writers: Vec::with_capacity(world),
            mailbox: Arc::new(Mailbox::new(rank, world)),
            timeout,
        };
        for (peer, stream) in peers.into_iter().enumerate() {
            let Some(stream) = stream else {
                if peer != rank {
                    return Err(DeviceError::internal("a rank without a link to a peer"));
                }
                transport.writers.push(None);
                continue;
            };
            let setup = |e: std::io::Error| {
                link_err(rank, format!("setting up the link to rank {peer}: {e}"))
            };
            stream.set_nodelay(true).map_err(setup)?;
            stream.set_read_timeout(None).map_err(setup)?;
            let reader = stream.try_clone().map_err(setup)?;
            let mailbox = Arc::clone(&transport.mailbox);
            let reader_stopped = Arc::new(OnceLock::new());
            let stopped = Arc::clone(&reader_stopped);
            std::thread::Builder::new()
                .name(format!("cuflow-dist-{rank}-from-{peer}"))
                .spawn(move || read_frames(reader, peer, &mailbox, &stopped))
                .map_err(|e| link_err(rank, format!("starting the reader of rank {peer}: {e}")))?;
            transport.writers.push(Some(Mutex::new(Link {
                stream,
                broken: None,
                reader_stopped,
            })));
        }
        Ok(transport)
    }
}

/// Reads frames from `peer` into `mailbox` until the link closes or fails, then, whatever
/// happened (a panic included), sets `stopped` to the reason, shuts the link and closes
/// `peer`'s mailbox with the reason.
fn read_frames(mut stream: TcpStream, peer: usize, mailbox: &Mailbox, stopped: &OnceLock<String>) {
    let read = std::panic::catch_unwind(AssertUnwindSafe(|| {
        read_until_closed(&mut stream, peer, mailbox)
    }));
    let reason = read.unwrap_or_else(|panic| {
        let what = match DeviceError::from_panic("the link's reader", &*panic) {
            DeviceError::Panicked { message, .. } => message,
            other => other.to_string(),
        };
        format!("its reader failed ({what}), a bug in cuflow")
    });
    tracing::debug!(peer, %reason, "cuflow-dist link closed");
    let _ = stopped.set(reason.clone());
    // The link is done (or out of frame): shut it, so that this rank's sends on it fail at
    // once, saying why (above), and the peer sees it close instead of its sends stalling.
    let _ = stream.shutdown(Shutdown::Both);
    mailbox.close(peer, reason);
}

/// Delivers `peer`'s frames to `mailbox`; why they stopped.
fn read_until_closed(stream: &mut TcpStream, peer: usize, mailbox: &Mailbox) -> String {
    loop {
        let mut tag = [0u8; 8];
        let mut len = [0u8; 8];
        if let Err(e) = stream
            .read_exact(&mut tag)
            .and_then(|()| stream.read_exact(&mut len))
        {
            return format!("its connection closed ({e})");
        }
        match read_message(stream, u64::from_le_bytes(len)) {
            Ok(data) => mailbox.deliver(peer, u64::from_le_bytes(tag), data),
            Err(reason) => return reason,
        }
    }
}

/// The `len` bytes of a message, held in room that grows with the bytes that arrived.
fn read_message(stream: &mut TcpStream, len: u64) -> Result<Vec<u8>, String> {
    let Some(len) = usize::try_from(len).ok().filter(|_| len <= LONGEST_MESSAGE) else {
        return Err(format!(
            "it announced a message of {len} bytes, more than a process can hold (is it a \
             cuflow rank of this version?)"
        ));
    };
    let mut data = Vec::new();
    while data.len() < len {
        let start = data.len();
        let room = (len - start).min(start.max(FIRST_ROOM));
        if let Err(e) = data.try_reserve_exact(room) {
            return Err(format!(
                "no memory for the rest of its message of {len} bytes after {start} ({e})"
            ));
        }
        data.resize(start + room, 0);
        if let Err(e) = stream.read_exact(&mut data[start..]) {
            return Err(format!(
                "its connection closed in a message of {len} bytes ({e})"
            ));
        }
    }
    Ok(data)
}

/// Writes all of `buf` to `stream` before `deadline` (none: no deadline), each write waiting
/// at most the time left; counts the bytes written in `went`.
fn write_before(
    mut stream: &TcpStream,
    mut buf: &[u8],
    deadline: Option<Instant>,
    went: &mut usize,
) -> std::io::Result<()> {
    while !buf.is_empty() {
        let left = match deadline {
            Some(at) => {
                let left = at.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(ErrorKind::TimedOut.into());
                }
                Some(left)
            }
            None => None,
        };
        stream.set_write_timeout(left)?;
        match stream.write(buf) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(n) => {
                *went += n;
                buf = buf.get(n..).unwrap_or_default();
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

impl HostTransport for TcpTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.writers.len()
    }

    fn send(&self, peer: usize, tag: u64, data: Vec<u8>) -> Result<(), DeviceError> {
        let Some(Some(link)) = self.writers.get(peer) else {
            return Err(DeviceError::internal("a send to a rank without a link"));
        };
        let mut link = link.lock();
        if let Some(why) = &link.broken {
            return Err(DeviceError::Collective {
                op: "send",
                rank: self.rank,
                reason: format!(
                    "the link to rank {peer} was closed when an earlier send failed ({why}); \
                     make a new communicator"
                ),
            });
        }
        let mut header = [0u8; 16];
        header[..8].copy_from_slice(&tag.to_le_bytes());
        header[8..].copy_from_slice(&(data.len() as u64).to_le_bytes());
        let deadline = Instant::now().checked_add(self.timeout);
        let mut went = 0;
        let written = write_before(&link.stream, &header, deadline, &mut went)
            .and_then(|()| write_before(&link.stream, &data, deadline, &mut went));
        let Err(e) = written else {
            return Ok(());
        };
        // The frame was cut short: the link is out of frame for good.
        let _ = link.stream.shutdown(Shutdown::Both);
        let frame = header.len() + data.len();
        let error = match e.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => DeviceError::Timeout {
                what: format!(
                    "rank {} waiting for rank {peer} to take the last {} bytes of a \
                     {frame}-byte message",
                    self.rank,
                    frame.saturating_sub(went)
                ),
                waited_ms: crate::config::millis(self.timeout),
            },
            _ => DeviceError::Collective {
                op: "send",
                rank: self.rank,
                reason: match link.reader_stopped.get() {
                    Some(why) => format!(
                        "sending to rank {peer} ({went} of {frame} bytes went): {e}; the link \
                         had closed: {why}"
                    ),
                    None => format!("sending to rank {peer} ({went} of {frame} bytes went): {e}"),
                },
            },
        };
        link.broken = Some(error.to_string());
        Err(error)
    }

    /// Sends the abort frame on every link still in frame; a link a failed send closed is
    /// skipped (its peer already saw it close).
    fn abort(&self, reason: &str) {
        for peer in (0..self.writers.len()).filter(|&p| p != self.rank) {
            if let Err(e) = self.send(peer, ABORT_TAG, reason.as_bytes().to_vec()) {
                tracing::debug!(peer, error = %e, "telling a peer of a failed collective");
            }
        }
    }

    /// As [`abort`](Self::abort), with the close frame.
    fn close(&self, reason: &str) {
        for peer in (0..self.writers.len()).filter(|&p| p != self.rank) {
            if let Err(e) = self.send(peer, CLOSE_TAG, reason.as_bytes().to_vec()) {
                tracing::debug!(peer, error = %e, "telling a peer of a call given up");
            }
        }
    }

    fn recv(&self, peer: usize, tag: u64) -> Result<Vec<u8>, DeviceError> {
        self.mailbox.take(peer, tag, self.timeout)
    }
}

impl Drop for TcpTransport {
    fn drop(&mut self) {
        // Ends the reader threads: their reads fail once the connections are shut.
        for w in self.writers.iter().flatten() {
            let _ = w.lock().stream.shutdown(Shutdown::Both);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;

    use super::*;

    #[test]
    fn a_failed_setup_closes_the_links_already_set_up() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a listener");
        let mut far =
            TcpStream::connect(listener.local_addr().expect("its address")).expect("a link");
        let (near, _) = listener.accept().expect("its other end");
        // Rank 0 of 3 with a link to rank 1 but none to rank 2: the setup fails after rank 1's
        // link and its reader were set up.
        let e = TcpTransport::new(0, vec![None, Some(near), None], Duration::from_secs(5))
            .expect_err("a missing link");
        far.set_read_timeout(Some(Duration::from_secs(2)))
            .expect("a read timeout");
        let mut byte = [0u8; 1];
        let closed = far.read(&mut byte).map_err(|e| e.kind());
        assert_eq!(closed, Ok(0), "the link stayed open after: {e}");
    }
}
