//! The TCP host transport: one connection per pair of ranks, framed messages, and a reader
//! thread per connection that drains it into this rank's mailbox, so that a send never waits
//! for the peer to receive (its writes always find a reader) and a broken link marks the peer
//! gone at once.
//!
//! A frame is the tag (u64) and the length (u64), little-endian, then the bytes.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use cuflow_runtime::{DeviceError, HostTransport};
use parking_lot::Mutex;

use crate::mailbox::{Mailbox, ABORT_TAG};

/// One rank's connections to the others.
pub(crate) struct TcpTransport {
    rank: usize,
    writers: Vec<Option<Mutex<TcpStream>>>,
    mailbox: Arc<Mailbox>,
    timeout: Duration,
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
        let mailbox = Arc::new(Mailbox::new(rank, world));
        let mut writers = Vec::with_capacity(world);
        for (peer, stream) in peers.into_iter().enumerate() {
            let Some(stream) = stream else {
                if peer != rank {
                    return Err(DeviceError::internal("a rank without a link to a peer"));
                }
                writers.push(None);
                continue;
            };
            let setup = |e: std::io::Error| {
                link_err(rank, format!("setting up the link to rank {peer}: {e}"))
            };
            stream.set_nodelay(true).map_err(setup)?;
            stream.set_read_timeout(None).map_err(setup)?;
            stream.set_write_timeout(Some(timeout)).map_err(setup)?;
            let reader = stream.try_clone().map_err(setup)?;
            let mailbox = Arc::clone(&mailbox);
            std::thread::Builder::new()
                .name(format!("cuflow-dist-{rank}-from-{peer}"))
                .spawn(move || read_frames(reader, peer, &mailbox))
                .map_err(|e| link_err(rank, format!("starting the reader of rank {peer}: {e}")))?;
            writers.push(Some(Mutex::new(stream)));
        }
        Ok(TcpTransport {
            rank,
            writers,
            mailbox,
            timeout,
        })
    }
}

/// Reads frames from `peer` into `mailbox` until the link closes.
fn read_frames(mut stream: TcpStream, peer: usize, mailbox: &Mailbox) {
    let reason = loop {
        let mut header = [0u8; 16];
        if let Err(e) = stream.read_exact(&mut header) {
            break format!("its connection closed ({e})");
        }
        let tag = u64::from_le_bytes(header[..8].try_into().unwrap_or_default());
        let len = u64::from_le_bytes(header[8..].try_into().unwrap_or_default());
        let mut data = Vec::new();
        if usize::try_from(len)
            .map(|n| data.try_reserve_exact(n))
            .is_err()
        {
            break format!("it announced a message of {len} bytes");
        }
        data.resize(len as usize, 0);
        if let Err(e) = stream.read_exact(&mut data) {
            break format!("its connection closed in a message ({e})");
        }
        mailbox.deliver(peer, tag, data);
    };
    tracing::debug!(peer, %reason, "cuflow-dist link closed");
    mailbox.close(peer, reason);
}

impl HostTransport for TcpTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.writers.len()
    }

    fn send(&self, peer: usize, tag: u64, data: Vec<u8>) -> Result<(), DeviceError> {
        let Some(Some(writer)) = self.writers.get(peer) else {
            return Err(DeviceError::internal("a send to a rank without a link"));
        };
        let mut header = [0u8; 16];
        header[..8].copy_from_slice(&tag.to_le_bytes());
        header[8..].copy_from_slice(&(data.len() as u64).to_le_bytes());
        let mut w = writer.lock();
        w.write_all(&header)
            .and_then(|()| w.write_all(&data))
            .map_err(|e| DeviceError::Collective {
                op: "send",
                rank: self.rank,
                reason: format!("sending to rank {peer}: {e}"),
            })
    }

    fn abort(&self, reason: &str) {
        for peer in (0..self.writers.len()).filter(|&p| p != self.rank) {
            if let Err(e) = self.send(peer, ABORT_TAG, reason.as_bytes().to_vec()) {
                tracing::debug!(peer, error = %e, "telling a peer of a failed collective");
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
            let _ = w.lock().shutdown(Shutdown::Both);
        }
    }
}
