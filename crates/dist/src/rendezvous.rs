//! The TCP rendezvous: how the ranks of several processes find each other.
//!
//! Rank 0 listens at the master address; every other rank connects to it (retrying until its
//! deadline, since rank 0 may start later and its name may resolve only once it is up) and says
//! who it is and where it listens. Once every rank has arrived, rank 0 answers each with the
//! table of all ranks' addresses and a payload (the NCCL unique id on CUDA devices). For the
//! host backend the ranks then connect into a full mesh: rank 0 keeps the rendezvous
//! connections, and every rank `i > 1` connects to each rank `1 ≤ j < i` (whose listener was
//! open before it announced itself to rank 0).
//!
//! Every read, accept and connect has a deadline: a rank that never arrives is a
//! [`DeviceError::Timeout`], a rank that answers something else a [`DeviceError::Collective`].
//! A connection to rank 0 that does not open with a cuflow rank's hello within a few seconds
//! (a port scan, a health check, garbage) is not a rank: rank 0 drops it, says so in a
//! warning, and goes on waiting for the ranks. Integers travel little-endian.

use std::collections::BTreeMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use cuflow_runtime::DeviceError;

use crate::config::DistConfig;

/// Opens every hello and answer; its last two bytes are the version of what ranks exchange
/// (the rendezvous, and the host transport's messages).
const MAGIC: &[u8; 8] = b"cuflow\x02\x00";
const STEP: &str = "rendezvous";

/// How long rank 0 waits for a connection's hello before it takes the connection for a
/// stranger's and drops it (a rank sends its hello as soon as it has connected).
const HELLO_WAIT: Duration = Duration::from_secs(5);

/// What a rank has once the rendezvous is over: a connection to each other rank (when a mesh
/// was asked for) and rank 0's payload.
pub(crate) struct Links {
    pub(crate) peers: Vec<Option<TcpStream>>,
    pub(crate) payload: Vec<u8>,
}

fn err(rank: usize, reason: impl Into<String>) -> DeviceError {
    DeviceError::Collective {
        op: STEP,
        rank,
        reason: reason.into(),
    }
}

struct Deadline {
    /// `None` when `total` reaches past what the clock can represent: no deadline then.
    at: Option<Instant>,
    total: Duration,
}

impl Deadline {
    fn new(total: Duration) -> Deadline {
        Deadline {
            at: Instant::now().checked_add(total),
            total,
        }
    }

    fn left(&self, what: impl Fn() -> String) -> Result<Duration, DeviceError> {
        let Some(at) = self.at else {
            return Ok(self.total);
        };
        let left = at.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(self.timeout(what()));
        }
        Ok(left)
    }

    fn timeout(&self, what: String) -> DeviceError {
        DeviceError::Timeout {
            what,
            waited_ms: crate::config::millis(self.total),
        }
    }
}

/// A connection to a rank, read and written under one deadline.
struct Conn<'d> {
    stream: TcpStream,
    rank: usize,
    deadline: &'d Deadline,
    peer: String,
    /// Set while reading a hello on rank 0, until the connection has opened with the magic
    /// of a cuflow rank (of any version): a failure before then is a stranger's.
    stranger: bool,
}

impl Conn<'_> {
    fn io_err(&self, what: &str, e: std::io::Error) -> DeviceError {
        match e.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => self
                .deadline
                .timeout(format!("rank {} {what} {}", self.rank, self.peer)),
            _ => err(self.rank, format!("{what} {}: {e}", self.peer)),
        }
    }

    fn read(&mut self, buf: &mut [u8]) -> Result<(), DeviceError> {
        let left = self
            .deadline
            .left(|| format!("rank {} reading from {}", self.rank, self.peer))?;
        self.stream
            .set_read_timeout(Some(left))
            .map_err(|e| self.io_err("setting a timeout on", e))?;
        let r = self.stream.read_exact(buf);
        r.map_err(|e| self.io_err("reading from", e))
    }

    fn write(&mut self, buf: &[u8]) -> Result<(), DeviceError> {
        let left = self
            .deadline
            .left(|| format!("rank {} writing to {}", self.rank, self.peer))?;
        self.stream
            .set_write_timeout(Some(left))
            .map_err(|e| self.io_err("setting a timeout on", e))?;
        let r = self.stream.write_all(buf);
        r.map_err(|e| self.io_err("writing to", e))
    }

    fn u32(&mut self) -> Result<u32, DeviceError> {
        let mut b = [0u8; 4];
        self.read(&mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    fn bytes(&mut self) -> Result<Vec<u8>, DeviceError> {
        let len = self.u32()? as usize;
        if len > 1 << 20 {
            return Err(err(
                self.rank,
                format!("{} sent a {len}-byte field", self.peer),
            ));
        }
        let mut v = vec![0u8; len];
        self.read(&mut v)?;
        Ok(v)
    }

    fn magic(&mut self) -> Result<(), DeviceError> {
        let mut m = [0u8; 8];
        self.read(&mut m)?;
        if m[..6] == MAGIC[..6] {
            // A cuflow rank, of this version or another: what it says next is its own.
            self.stranger = false;
        }
        if &m != MAGIC {
            return Err(err(
                self.rank,
                format!("{} is not a cuflow rank of this version", self.peer),
            ));
        }
        Ok(())
    }
}

/// The first few of `ranks` (`count` in all), comma-separated, saying how many more there are.
fn some_of(ranks: impl Iterator<Item = usize>, count: usize) -> String {
    const SHOWN: usize = 8;
    let mut text = ranks
        .take(SHOWN)
        .map(|r| r.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    if count > SHOWN {
        text.push_str(&format!(", … {} more", count - SHOWN));
    }
    text
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

/// Accepts one connection before the deadline.
fn accept(
    listener: &TcpListener,
    rank: usize,
    deadline: &Deadline,
    waiting_for: impl Fn() -> String,
) -> Result<TcpStream, DeviceError> {
    listener
        .set_nonblocking(true)
        .map_err(|e| err(rank, format!("listening: {e}")))?;
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                stream
                    .set_nonblocking(false)
                    .map_err(|e| err(rank, format!("accepting: {e}")))?;
                return Ok(stream);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                deadline.left(&waiting_for)?;
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => return Err(err(rank, format!("accepting a connection: {e}"))),
        }
    }
}

/// Connects to `addr`, retrying while it does not resolve or nothing listens there yet (a
/// service name may resolve only once rank 0 is up), until the deadline.
fn connect(addr: &str, rank: usize, deadline: &Deadline) -> Result<TcpStream, DeviceError> {
    let waiting = || format!("rank {rank} connecting to {addr}");
    loop {
        let addrs: Vec<SocketAddr> = match addr.to_socket_addrs() {
            Ok(addrs) => addrs.collect(),
            Err(e) => {
                deadline.left(|| format!("rank {rank} resolving {addr} (last: {e})"))?;
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let left = deadline.left(waiting)?;
        let mut last = None;
        for a in &addrs {
            match TcpStream::connect_timeout(a, left.min(Duration::from_secs(1))) {
                Ok(s) => return Ok(s),
                Err(e) => last = Some(e),
            }
        }
        match last {
            Some(e)
                if matches!(
                    e.kind(),
                    ErrorKind::ConnectionRefused | ErrorKind::TimedOut | ErrorKind::WouldBlock
                ) =>
            {
                deadline.left(waiting)?;
                std::thread::sleep(Duration::from_millis(20));
            }
            Some(e) => return Err(err(rank, format!("connecting to {addr}: {e}"))),
            None => return Err(err(rank, format!("{addr} resolves to no address"))),
        }
    }
}

/// Runs the rendezvous of `config`'s rank. Rank 0 listens on `listener` (or binds the master
/// address) and hands `payload` to every rank; with `mesh`, every rank ends connected to
/// every other.
pub(crate) fn rendezvous(
    config: &DistConfig,
    listener: Option<TcpListener>,
    payload: &[u8],
    mesh: bool,
) -> Result<Links, DeviceError> {
    let deadline = Deadline::new(config.timeout);
    if config.rank == 0 {
        let listener = match listener {
            Some(l) => l,
            None => TcpListener::bind(config.master_addr()).map_err(|e| {
                let hint = match e.kind() {
                    ErrorKind::AddrInUse => {
                        "; another program listens there: give every rank a free MASTER_PORT, \
                         or CUFLOW_RENDEZVOUS_PORT"
                    }
                    ErrorKind::AddrNotAvailable => {
                        "; rank 0 listens at MASTER_ADDR, which must be an address of its machine"
                    }
                    _ => "",
                };
                err(
                    0,
                    format!("listening at {}: {e}{hint}", config.master_addr()),
                )
            })?,
        };
        serve(config, &listener, payload, mesh, &deadline)
    } else {
        join(config, mesh, &deadline)
    }
}

fn serve(
    config: &DistConfig,
    listener: &TcpListener,
    payload: &[u8],
    mesh: bool,
    deadline: &Deadline,
) -> Result<Links, DeviceError> {
    let world = config.world_size;
    // Room for the ranks that arrived, not for every rank the configuration claims.
    let mut conns: BTreeMap<usize, (Conn<'_>, String)> = BTreeMap::new();
    let local = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    while conns.len() + 1 < world {
        let missing = || {
            let ranks = (1..world).filter(|r| !conns.contains_key(r));
            format!(
                "rank 0 at {local} waiting for ranks [{}] of {world}",
                some_of(ranks, world - 1 - conns.len())
            )
        };
        let stream = accept(listener, 0, deadline, missing)?;
        let peer_ip = stream
            .peer_addr()
            .map(|a| a.ip().to_string())
            .unwrap_or_default();
        // A rank says who it is as soon as it has connected; a connection that says nothing
        // in time, closes, or says something else (a port scan, a health check) is not a
        // rank: it is dropped, and rank 0 goes on waiting for the ranks.
        let hello = Deadline::new(HELLO_WAIT.min(deadline.left(missing)?));
        let mut conn = Conn {
            stream,
            rank: 0,
            deadline: &hello,
            peer: format!("a rank at {peer_ip}"),
            stranger: true,
        };
        let said = (|| {
            conn.magic()?;
            let (rank, their_world) = (conn.u32()? as usize, conn.u32()? as usize);
            let mut port = [0u8; 2];
            conn.read(&mut port)?;
            Ok::<_, DeviceError>((rank, their_world, port))
        })();
        let (rank, their_world, port) = match said {
            Ok(said) => said,
            Err(e) if conn.stranger => {
                tracing::warn!(
                    "rendezvous: rank 0 dropped a connection from {peer_ip} that is not a \
                     cuflow rank ({e})"
                );
                continue;
            }
            Err(e) => return Err(e),
        };
        let mut conn = Conn {
            stream: conn.stream,
            rank: 0,
            deadline,
            peer: conn.peer,
            stranger: false,
        };
        if their_world != world || rank == 0 || rank >= world {
            return Err(err(
                0,
                format!(
                    "{} says it is rank {rank} of {their_world}; this world has {world} ranks \
                     (check RANK and WORLD_SIZE)",
                    conn.peer
                ),
            ));
        }
        if conns.contains_key(&rank) {
            return Err(err(0, format!("two processes say they are rank {rank}")));
        }
        conn.peer = format!("rank {rank}");
        let addr = SocketAddr::new(
            peer_ip.parse().unwrap_or([127, 0, 0, 1].into()),
            u16::from_le_bytes(port),
        );
        conns.insert(rank, (conn, addr.to_string()));
    }
    // Every rank arrived: the world is as large as it says.
    let mut reply = MAGIC.to_vec();
    put_bytes(&mut reply, payload);
    for rank in 0..world {
        put_bytes(
            &mut reply,
            conns.get(&rank).map_or(&b""[..], |(_, a)| a.as_bytes()),
        );
    }
    let mut peers: Vec<Option<TcpStream>> = (0..world).map(|_| None).collect();
    for (rank, (mut conn, _)) in conns {
        conn.write(&reply)?;
        if let Some(peer) = peers.get_mut(rank) {
            *peer = mesh.then_some(conn.stream);
        }
    }
    Ok(Links {
        peers,
        payload: payload.to_vec(),
    })
}

fn join(config: &DistConfig, mesh: bool, deadline: &Deadline) -> Result<Links, DeviceError> {
    let (rank, world) = (config.rank, config.world_size);
    let master = config.master_addr();
    let stream = connect(&master, rank, deadline)?;
    let mut conn = Conn {
        stream,
        rank,
        deadline,
        peer: format!("rank 0 at {master}"),
        stranger: false,
    };
    // Ranks above this one connect to this listener; it exists before rank 0 hears of us.
    let listener = if mesh && rank + 1 < world {
        let ip = conn
            .stream
            .local_addr()
            .map_err(|e| err(rank, format!("reading the local address: {e}")))?
            .ip();
        Some(
            TcpListener::bind(SocketAddr::new(ip, 0))
                .map_err(|e| err(rank, format!("listening on {ip}: {e}")))?,
        )
    } else {
        None
    };
    let port = match &listener {
        Some(l) => l
            .local_addr()
            .map_err(|e| err(rank, format!("reading the listener's address: {e}")))?
            .port(),
        None => 0,
    };
    let mut hello = MAGIC.to_vec();
    hello.extend_from_slice(&(rank as u32).to_le_bytes());
    hello.extend_from_slice(&(world as u32).to_le_bytes());
    hello.extend_from_slice(&port.to_le_bytes());
    conn.write(&hello)?;
    conn.magic()?;
    let payload = conn.bytes()?;
    let mut table = Vec::new();
    for _ in 0..world {
        table.push(String::from_utf8_lossy(&conn.bytes()?).into_owned());
    }
    // Rank 0 answered: every rank arrived, the world is as large as it says.
    let mut peers: Vec<Option<TcpStream>> = (0..world).map(|_| None).collect();
    if !mesh {
        return Ok(Links { peers, payload });
    }
    peers[0] = Some(conn.stream);
    for (j, addr) in table.iter().enumerate().take(rank).skip(1) {
        let stream = connect(addr, rank, deadline)?;
        let mut c = Conn {
            stream,
            rank,
            deadline,
            peer: format!("rank {j} at {addr}"),
            stranger: false,
        };
        let mut hello = MAGIC.to_vec();
        hello.extend_from_slice(&(rank as u32).to_le_bytes());
        c.write(&hello)?;
        peers[j] = Some(c.stream);
    }
    if let Some(listener) = listener {
        for _ in rank + 1..world {
            let missing = || {
                let ranks =
                    (rank + 1..world).filter(|&r| peers.get(r).is_some_and(Option::is_none));
                let left = ranks.clone().count();
                format!(
                    "rank {rank} waiting for ranks [{}] to connect",
                    some_of(ranks, left)
                )
            };
            let stream = accept(&listener, rank, deadline, missing)?;
            let mut c = Conn {
                stream,
                rank,
                deadline,
                peer: "a higher rank".into(),
                stranger: false,
            };
            c.magic()?;
            let from = c.u32()? as usize;
            if from <= rank || from >= world || peers[from].is_some() {
                return Err(err(
                    rank,
                    format!("an unexpected connection from rank {from}"),
                ));
            }
            peers[from] = Some(c.stream);
        }
    }
    Ok(Links { peers, payload })
}
