//! [`DistConfig`]: where a process stands in a multi-process group, read from the environment
//! that `torchrun` and Slurm set, or given directly.

use std::time::Duration;

use cuflow_runtime::DeviceError;

/// The default deadline of every wait for a peer: 300 s, unless `CUFLOW_DIST_TIMEOUT_MS` says
/// otherwise.
///
/// A value that is not a positive number of milliseconds is ignored, with a warning through
/// `tracing` ([`DistConfig::from_env`] refuses it).
pub fn default_timeout() -> Duration {
    match std::env::var("CUFLOW_DIST_TIMEOUT_MS") {
        Ok(v) => timeout_ms(&v).unwrap_or_else(|e| {
            tracing::warn!("{e}; waiting 300 s for peers");
            DEFAULT_TIMEOUT
        }),
        Err(_) => DEFAULT_TIMEOUT,
    }
}

const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// `d` in whole milliseconds, saturating (for the `waited_ms` of a timeout).
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `CUFLOW_DIST_TIMEOUT_MS`'s value `v` as a deadline.
fn timeout_ms(v: &str) -> Result<Duration, DeviceError> {
    match v.trim().parse::<u64>() {
        Ok(ms) if ms > 0 => Ok(Duration::from_millis(ms)),
        _ => Err(DeviceError::usage(format!(
            "CUFLOW_DIST_TIMEOUT_MS={v:?} is not a positive number of milliseconds"
        ))),
    }
}

/// A process's place in a multi-process group: its rank, the world size, its rank on this
/// machine, rank 0's address, and the deadline of every wait for a peer.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use cuflow_dist::DistConfig;
/// let config = DistConfig::new(1, 4, "10.0.0.1", 29500).with_timeout(Duration::from_secs(30));
/// assert_eq!((config.rank, config.world_size), (1, 4));
/// assert_eq!(config.master_addr(), "10.0.0.1:29500");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DistConfig {
    /// This process's rank, in `0..world_size`.
    pub rank: usize,
    /// The number of ranks.
    pub world_size: usize,
    /// This process's rank among those of its machine (which local device it uses).
    pub local_rank: usize,
    /// The host rank 0 listens on.
    pub master_host: String,
    /// The port rank 0 listens on (from the environment: see [`DistConfig::from_env`]).
    pub master_port: u16,
    /// The deadline of every wait for a peer (the rendezvous, and each collective's wait on
    /// the host backend).
    pub timeout: Duration,
}

impl DistConfig {
    /// Rank `rank` of `world_size`, with rank 0 at `master_host:master_port`; its local rank is
    /// its rank, its timeout [`default_timeout`].
    pub fn new(rank: usize, world_size: usize, master_host: &str, master_port: u16) -> Self {
        DistConfig {
            rank,
            world_size,
            local_rank: rank,
            master_host: master_host.to_string(),
            master_port,
            timeout: default_timeout(),
        }
    }

    /// The same place with another deadline for every wait. One past what the clock can
    /// represent (`Duration::MAX`) waits as long as it takes.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The place the environment gives: `RANK`, `WORLD_SIZE`, `LOCAL_RANK` (default: the rank),
    /// `MASTER_ADDR` (default `127.0.0.1`) and `MASTER_PORT` (default 29500), as `torchrun`
    /// sets them; under Slurm without them, `SLURM_PROCID`, `SLURM_NTASKS` and
    /// `SLURM_LOCALID`. The timeout comes from `CUFLOW_DIST_TIMEOUT_MS`.
    ///
    /// Rank 0 listens at `MASTER_PORT`, except under torchrun's agent store
    /// (`TORCHELASTIC_USE_AGENT_STORE=True`, torchrun's default), which the agent itself serves
    /// at that port: there rank 0 listens at `MASTER_PORT + 1`. `CUFLOW_RENDEZVOUS_PORT` names
    /// the port instead, in either case.
    ///
    /// # Errors
    ///
    /// [`DeviceError::Usage`] naming the variable that is missing or not a number (a port or a
    /// timeout of 0 included), or a rank outside the world.
    pub fn from_env() -> Result<Self, DeviceError> {
        from_lookup(|k| std::env::var(k).ok())
    }

    /// `host:port` of rank 0.
    pub fn master_addr(&self) -> String {
        if self.master_host.contains(':') && !self.master_host.starts_with('[') {
            format!("[{}]:{}", self.master_host, self.master_port)
        } else {
            format!("{}:{}", self.master_host, self.master_port)
        }
    }
}

/// [`DistConfig::from_env`] over any variable lookup.
pub(crate) fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<DistConfig, DeviceError> {
    let number = |names: &[&str]| -> Result<Option<usize>, DeviceError> {
        for name in names {
            if let Some(v) = get(name) {
                return v
                    .trim()
                    .parse::<usize>()
                    .map(Some)
                    .map_err(|_| DeviceError::usage(format!("{name}={v:?} is not a number")));
            }
        }
        Ok(None)
    };
    let missing = |what: &str| {
        DeviceError::usage(format!(
            "{what} is not set: run under torchrun (or Slurm), or set RANK, WORLD_SIZE, \
             MASTER_ADDR and MASTER_PORT"
        ))
    };
    let rank = number(&["RANK", "SLURM_PROCID"])?.ok_or_else(|| missing("RANK"))?;
    let world_size =
        number(&["WORLD_SIZE", "SLURM_NTASKS"])?.ok_or_else(|| missing("WORLD_SIZE"))?;
    if rank >= world_size {
        return Err(DeviceError::usage(format!(
            "RANK={rank} is outside WORLD_SIZE={world_size}"
        )));
    }
    let local_rank = number(&["LOCAL_RANK", "SLURM_LOCALID"])?.unwrap_or(rank);
    let master_host = get("MASTER_ADDR").unwrap_or_else(|| "127.0.0.1".into());
    let port = |name: &str, p: usize| {
        u16::try_from(p).ok().filter(|&p| p != 0).ok_or_else(|| {
            DeviceError::usage(format!(
                "{name}={p} is not a port rank 0 can listen at (1 to 65535)"
            ))
        })
    };
    let master_port = match number(&["CUFLOW_RENDEZVOUS_PORT"])? {
        Some(p) => port("CUFLOW_RENDEZVOUS_PORT", p)?,
        None => {
            let master_port = match number(&["MASTER_PORT"])? {
                Some(p) => port("MASTER_PORT", p)?,
                None => 29500,
            };
            // torchrun's agent serves its own store at MASTER_PORT and tells its workers to use
            // it; rank 0 listens beside it.
            let agent_store = get("TORCHELASTIC_USE_AGENT_STORE")
                .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
            if agent_store {
                master_port.checked_add(1).ok_or_else(|| {
                    DeviceError::usage(format!(
                        "torchrun's agent serves its store at MASTER_PORT={master_port}, and rank 0 \
                         listens at the next port, which does not exist: set \
                         CUFLOW_RENDEZVOUS_PORT to a free port"
                    ))
                })?
            } else {
                master_port
            }
        }
    };
    Ok(DistConfig {
        rank,
        world_size,
        local_rank,
        master_host,
        master_port,
        timeout: match get("CUFLOW_DIST_TIMEOUT_MS") {
            Some(v) => timeout_ms(&v)?,
            None => DEFAULT_TIMEOUT,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn torchrun_variables_give_the_place() {
        let c = from_lookup(env(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "1"),
            ("MASTER_ADDR", "node0"),
            ("MASTER_PORT", "1234"),
            ("CUFLOW_DIST_TIMEOUT_MS", "250"),
        ]))
        .unwrap();
        assert_eq!((c.rank, c.world_size, c.local_rank), (3, 8, 1));
        assert_eq!(c.master_addr(), "node0:1234");
        assert_eq!(c.timeout, Duration::from_millis(250));
    }

    /// torchrun's agent serves its own store at `MASTER_ADDR:MASTER_PORT` (and says so with
    /// `TORCHELASTIC_USE_AGENT_STORE=True`): rank 0 listens at the next port, unless
    /// `CUFLOW_RENDEZVOUS_PORT` names one.
    #[test]
    fn under_torchruns_agent_store_rank_0_listens_at_the_next_port() {
        let torchrun = [
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "29500"),
            ("TORCHELASTIC_USE_AGENT_STORE", "True"),
        ];
        let c = from_lookup(env(&torchrun)).unwrap();
        assert_eq!(c.master_addr(), "127.0.0.1:29501");

        let mut no_agent_store = torchrun;
        no_agent_store[4] = ("TORCHELASTIC_USE_AGENT_STORE", "False");
        let c = from_lookup(env(&no_agent_store)).unwrap();
        assert_eq!(c.master_addr(), "127.0.0.1:29500");

        let mut chosen = torchrun.to_vec();
        chosen.push(("CUFLOW_RENDEZVOUS_PORT", "40000"));
        let c = from_lookup(env(&chosen)).unwrap();
        assert_eq!(c.master_addr(), "127.0.0.1:40000");

        let mut last_port = torchrun;
        last_port[3] = ("MASTER_PORT", "65535");
        let e = from_lookup(env(&last_port)).unwrap_err().to_string();
        assert!(e.contains("CUFLOW_RENDEZVOUS_PORT"), "{e}");
    }

    #[test]
    fn slurm_variables_stand_in_for_torchrun_ones() {
        let c = from_lookup(env(&[
            ("SLURM_PROCID", "2"),
            ("SLURM_NTASKS", "4"),
            ("SLURM_LOCALID", "0"),
        ]))
        .unwrap();
        assert_eq!((c.rank, c.world_size, c.local_rank), (2, 4, 0));
        assert_eq!(c.master_addr(), "127.0.0.1:29500");
    }

    #[test]
    fn missing_or_bad_variables_are_named() {
        let e = from_lookup(env(&[("WORLD_SIZE", "2")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("RANK is not set"), "{e}");
        let e = from_lookup(env(&[("RANK", "x"), ("WORLD_SIZE", "2")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("RANK=\"x\" is not a number"), "{e}");
        let e = from_lookup(env(&[("RANK", "2"), ("WORLD_SIZE", "2")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("outside WORLD_SIZE=2"), "{e}");
    }

    #[test]
    fn a_malformed_timeout_or_port_zero_is_an_error_not_a_default() {
        let base = [("RANK", "0"), ("WORLD_SIZE", "2")];
        for (var, value, says) in [
            (
                "CUFLOW_DIST_TIMEOUT_MS",
                "30s",
                "CUFLOW_DIST_TIMEOUT_MS=\"30s\"",
            ),
            (
                "CUFLOW_DIST_TIMEOUT_MS",
                "0",
                "CUFLOW_DIST_TIMEOUT_MS=\"0\"",
            ),
            ("MASTER_PORT", "0", "MASTER_PORT=0"),
            ("CUFLOW_RENDEZVOUS_PORT", "0", "CUFLOW_RENDEZVOUS_PORT=0"),
            (
                "CUFLOW_RENDEZVOUS_PORT",
                "http",
                "CUFLOW_RENDEZVOUS_PORT=\"http\"",
            ),
        ] {
            let vars = [base[0], base[1], (var, value)];
            let e = from_lookup(env(&vars)).unwrap_err().to_string();
            assert!(e.contains(says), "{var}={value}: {e}");
        }
    }
}
