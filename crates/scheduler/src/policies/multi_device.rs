//! `MultiDevice`: the branches of an op's outermost `zip!` spread over several devices, each
//! device with its own round-robin stream pool.
//!
//! Only the outermost branches move between devices (depth 1, see [`Placement::depth`]); work
//! nested inside a branch, and the lazy inputs of a kernel ([`Placement::same_device`]), stay on
//! their parent's device, so that a kernel finds its inputs where it runs. Load counts are
//! advisory: a policy only picks streams, and the executor orders the work whatever it picks.

use std::sync::Arc;

use cuflow_runtime::{Device, DeviceError, Event, Stream};
use parking_lot::Mutex;

use crate::{Placement, SchedulingPolicy, StreamPoolRoundRobin};

/// How [`MultiDevice`] chooses the device of an outermost `zip!` branch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DeviceSpread {
    /// Branch `i` runs on device `i mod N`: predictable, so that branch `i`'s data can be
    /// prepared on its device beforehand.
    #[default]
    RoundRobin,
    /// Each branch runs on the device with the fewest unfinished branches (those of earlier
    /// executions still running, plus those of the current `zip!` already placed); ties go
    /// to device `i mod N` and then to the devices after it.
    LeastLoaded,
}

/// Branch counts per device, for [`DeviceSpread::LeastLoaded`].
#[derive(Debug, Default)]
struct Loads {
    /// Completion events of branches reported by the executor, per device.
    in_flight: Vec<Vec<Event>>,
    /// Branches of the `zip!` being placed, per device (reset at its first branch).
    placed: Vec<usize>,
}

impl Loads {
    fn unfinished(&mut self) -> Vec<usize> {
        self.in_flight
            .iter_mut()
            .zip(&self.placed)
            .map(|(events, placed)| {
                events.retain(|e| !e.is_complete().unwrap_or(true));
                events.len() + placed
            })
            .collect()
    }
}

/// Spreads the branches of an op's outermost `zip!` / `join_all` over several devices, per
/// [`DeviceSpread`]; each device has a pool of streams served round-robin.
///
/// - The root of an execution runs on the first device, which is the policy's
///   [`device`](SchedulingPolicy::device): outputs of the root (and so of `sync_with_policy`
///   and `schedule`) live there unless a branch made them elsewhere.
/// - A branch of the outermost `zip!` runs on the device [`DeviceSpread`] picks, on the next
///   stream of that device's pool. The executor orders it after the parent's earlier work and
///   the parent after it with events, across devices.
/// - Work nested inside a branch, and the lazy inputs of a kernel, stay on their parent's
///   device.
///
/// Tensors a branch reads must be on the branch's device (kernels check it): build them inside
/// the branch, or move them with `.to_device(..)`. With one device it behaves like a
/// [`StreamPoolRoundRobin`] of that device. All devices must be of one backend. Clones share the
/// pools and the load counts.
///
/// # Examples
///
/// ```
/// use cuflow_runtime::Device;
/// use cuflow_scheduler::{MultiDevice, Placement, SchedulingPolicy};
/// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
/// let devices = [Device::host(), Device::host_numbered(1)];
/// let policy = MultiDevice::new(&devices, 2)?;
/// let root = policy.place(&Placement::root(policy.device()))?;
/// let b0 = policy.place(&Placement::branch(&devices[0], &root, 0, 2))?;
/// let b1 = policy.place(&Placement::branch(&devices[0], &root, 1, 2))?;
/// assert_eq!((b0.device(), b1.device()), (&devices[0], &devices[1]));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct MultiDevice {
    devices: Arc<[Device]>,
    pools: Arc<[StreamPoolRoundRobin]>,
    spread: DeviceSpread,
    loads: Arc<Mutex<Loads>>,
}

impl MultiDevice {
    /// A policy over `devices` (the first is the home device), with `streams_per_device` new
    /// streams on each, spreading branches round-robin ([`DeviceSpread::RoundRobin`]).
    ///
    /// # Errors
    ///
    /// [`DeviceError::Usage`] for no devices, a device given twice, devices of different
    /// backends, or `streams_per_device == 0`; the error of creating a stream.
    pub fn new(devices: &[Device], streams_per_device: usize) -> Result<Self, DeviceError> {
        Self::with_spread(devices, streams_per_device, DeviceSpread::RoundRobin)
    }

    /// A policy as [`MultiDevice::new`] that sends each branch to the least loaded device
    /// ([`DeviceSpread::LeastLoaded`]).
    ///
    /// # Errors
    ///
    /// As [`MultiDevice::new`].
    pub fn least_loaded(
        devices: &[Device],
        streams_per_device: usize,
    ) -> Result<Self, DeviceError> {
        Self::with_spread(devices, streams_per_device, DeviceSpread::LeastLoaded)
    }

    /// A policy over `devices` with `streams_per_device` streams on each, spreading branches
    /// per `spread`.
    ///
    /// # Errors
    ///
    /// As [`MultiDevice::new`].
    pub fn with_spread(
        devices: &[Device],
        streams_per_device: usize,
        spread: DeviceSpread,
    ) -> Result<Self, DeviceError> {
        let Some(home) = devices.first() else {
            return Err(DeviceError::usage(
                "MultiDevice needs at least one device; pass e.g. every visible CUDA device",
            ));
        };
        for (i, d) in devices.iter().enumerate() {
            if devices[..i].contains(d) {
                return Err(DeviceError::usage(format!(
                    "MultiDevice was given {d} twice; list each device once"
                )));
            }
            if d.kind() != home.kind() {
                return Err(DeviceError::usage(format!(
                    "MultiDevice needs devices of one backend, but was given {home} ({}) and \
                     {d} ({}); use only CUDA devices or only host devices",
                    home.kind(),
                    d.kind()
                )));
            }
        }
        let pools = devices
            .iter()
            .map(|d| StreamPoolRoundRobin::new(d, streams_per_device))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(MultiDevice {
            devices: devices.into(),
            pools: pools.into(),
            spread,
            loads: Arc::new(Mutex::new(Loads {
                in_flight: vec![Vec::new(); devices.len()],
                placed: vec![0; devices.len()],
            })),
        })
    }

    /// The devices, home device first.
    pub fn devices(&self) -> &[Device] {
        &self.devices
    }

    /// How branches are spread.
    pub fn spread(&self) -> DeviceSpread {
        self.spread
    }

    /// The stream pool of `device`, if it is one of the policy's devices.
    pub fn pool(&self, device: &Device) -> Option<&StreamPoolRoundRobin> {
        self.index_of(device).map(|i| &self.pools[i])
    }

    /// Unfinished branches per device, in the order of [`MultiDevice::devices`]: those the
    /// executor reported and that are still running, plus those of the `zip!` being placed.
    pub fn loads(&self) -> Vec<usize> {
        self.loads.lock().unfinished()
    }

    fn index_of(&self, device: &Device) -> Option<usize> {
        self.devices.iter().position(|d| d == device)
    }

    /// The device index for branch `index` of an outermost `zip!`.
    fn spread_branch(&self, index: usize) -> usize {
        let n = self.devices.len();
        let first = index % n;
        match self.spread {
            DeviceSpread::RoundRobin => first,
            DeviceSpread::LeastLoaded => {
                let mut loads = self.loads.lock();
                if index == 0 {
                    loads.placed.iter_mut().for_each(|p| *p = 0);
                }
                let unfinished = loads.unfinished();
                let best = (0..n)
                    .map(|k| (first + k) % n)
                    .min_by_key(|&d| unfinished[d])
                    .unwrap_or(first);
                loads.placed[best] += 1;
                best
            }
        }
    }
}

impl SchedulingPolicy for MultiDevice {
    fn device(&self) -> &Device {
        &self.devices[0]
    }

    fn place(&self, request: &Placement<'_>) -> Result<Stream, DeviceError> {
        let device = match request.branch {
            None => 0,
            Some((index, _)) if request.depth <= 1 && !request.same_device => {
                self.spread_branch(index)
            }
            // Nested work and kernel inputs stay with their parent.
            Some(_) => request
                .parent
                .and_then(|p| self.index_of(p.device()))
                .or_else(|| self.index_of(request.device))
                .unwrap_or(0),
        };
        self.pools[device].place(request)
    }

    fn on_enqueued(&self, stream: &Stream, done: &Event) {
        if let Some(i) = self.index_of(stream.device()) {
            let mut loads = self.loads.lock();
            let events = &mut loads.in_flight[i];
            if events.len() >= 64 {
                events.retain(|e| !e.is_complete().unwrap_or(true));
            }
            events.push(done.clone());
            loads.placed[i] = loads.placed[i].saturating_sub(1);
        }
    }
}
