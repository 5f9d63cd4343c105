//! The in-process host transport: the ranks of one process hand each other their messages
//! through shared mailboxes. A rank whose transport is dropped closes its slot in every
//! peer's mailbox, as a broken TCP link does.

use std::sync::Arc;
use std::time::Duration;

use cuflow_runtime::{DeviceError, HostTransport};

use crate::mailbox::{Mailbox, ABORT_TAG, CLOSE_TAG};

/// One rank of an in-process group.
pub(crate) struct LocalTransport {
    rank: usize,
    mailboxes: Arc<Vec<Mailbox>>,
    timeout: Duration,
}

impl std::fmt::Debug for LocalTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalTransport")
            .field("rank", &self.rank)
            .field("world_size", &self.mailboxes.len())
            .finish()
    }
}

impl LocalTransport {
    /// The transports of ranks `0..world_size`, in rank order.
    pub(crate) fn group(world_size: usize, timeout: Duration) -> Vec<LocalTransport> {
        let mailboxes = Arc::new(
            (0..world_size)
                .map(|r| Mailbox::new(r, world_size))
                .collect::<Vec<_>>(),
        );
        (0..world_size)
            .map(|rank| LocalTransport {
                rank,
                mailboxes: Arc::clone(&mailboxes),
                timeout,
            })
            .collect()
    }
}

impl Drop for LocalTransport {
    /// The rank is gone (its communicator, every pending collective and captured graph of it
    /// dropped, or its thread unwound): receives from it fail at once, as over a broken link,
    /// once the messages it sent before are taken.
    fn drop(&mut self) {
        for (peer, mailbox) in self.mailboxes.iter().enumerate() {
            if peer != self.rank {
                mailbox.close(
                    self.rank,
                    "its communicator was dropped, so it takes part in no more collectives".into(),
                );
            }
        }
    }
}

impl HostTransport for LocalTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.mailboxes.len()
    }

    fn send(&self, peer: usize, tag: u64, data: Vec<u8>) -> Result<(), DeviceError> {
        match self.mailboxes.get(peer) {
            Some(mailbox) => {
                mailbox.deliver(self.rank, tag, data);
                Ok(())
            }
            None => Err(DeviceError::internal("a send to a rank outside the world")),
        }
    }

    fn abort(&self, reason: &str) {
        for (peer, mailbox) in self.mailboxes.iter().enumerate() {
            if peer != self.rank {
                mailbox.deliver(self.rank, ABORT_TAG, reason.as_bytes().to_vec());
            }
        }
    }

    fn close(&self, reason: &str) {
        for (peer, mailbox) in self.mailboxes.iter().enumerate() {
            if peer != self.rank {
                mailbox.deliver(self.rank, CLOSE_TAG, reason.as_bytes().to_vec());
            }
        }
    }

    fn recv(&self, peer: usize, tag: u64) -> Result<Vec<u8>, DeviceError> {
        match self.mailboxes.get(self.rank) {
            Some(mailbox) => mailbox.take(peer, tag, self.timeout),
            None => Err(DeviceError::internal("a rank outside the world")),
        }
    }
}
