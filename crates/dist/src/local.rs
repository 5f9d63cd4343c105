//! The in-process host transport: the ranks of one process hand each other their messages
//! through shared mailboxes.

use std::sync::Arc;
use std::time::Duration;

use cuflow_runtime::{DeviceError, HostTransport};

use crate::mailbox::{Mailbox, ABORT_TAG};

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

    fn recv(&self, peer: usize, tag: u64) -> Result<Vec<u8>, DeviceError> {
        match self.mailboxes.get(self.rank) {
            Some(mailbox) => mailbox.take(peer, tag, self.timeout),
            None => Err(DeviceError::internal("a rank outside the world")),
        }
    }
}
