//! Running a kernel's host implementation on a host stream.
//!
//! The task owns its buffers (`Arc<Memory>`), so it may run after the caller dropped them. It
//! locks each distinct allocation once, in address order (write when any argument writes it),
//! and carves the argument ranges out of it: ranges of one allocation that is written must not
//! overlap, which is reported as an argument error rather than aliased.

use std::sync::{Arc, OnceLock};

use parking_lot::{Mutex, RwLockReadGuard, RwLockWriteGuard};

use super::capture::HostNodeKind;
use super::memory::host_mem;
use super::stream::HostStream;
use crate::error::{DeviceError, Result};
use crate::kernel::{HostKernelArgs, HostKernelFn, HostSlot, KernelArg, KernelArgs, LaunchConfig};
use crate::memory::Memory;

enum Guard<'g> {
    Read(RwLockReadGuard<'g, Vec<u64>>),
    Write(RwLockWriteGuard<'g, Vec<u64>>),
}

pub(crate) fn launch_host_kernel(
    stream: &HostStream,
    name: &Arc<str>,
    f: Arc<HostKernelFn>,
    config: LaunchConfig,
    args: &KernelArgs<'_>,
) -> Result<()> {
    let owned: Vec<KernelArg<Arc<Memory>>> = args
        .args
        .iter()
        .map(|a| a.map_mem(|mem| Arc::clone(mem)))
        .collect();
    let label = || {
        let (g, b) = (config.grid, config.block);
        format!(
            "{name} (kernel) grid {}x{}x{} block {}x{}x{}",
            g.0, g.1, g.2, b.0, b.1, b.2
        )
    };
    let task_name = Arc::clone(name);
    stream.enqueue(
        Arc::new(move || run(&task_name, &*f, config, &owned)),
        HostNodeKind::Kernel,
        label,
    )
}

fn run(
    name: &str,
    f: &HostKernelFn,
    config: LaunchConfig,
    args: &[KernelArg<Arc<Memory>>],
) -> Result<()> {
    // Distinct allocations, in address order, with whether any argument writes them (an empty
    // range writes nothing).
    let mut groups: Vec<(&Arc<Memory>, bool)> = Vec::new();
    for a in args {
        if let KernelArg::Buffer {
            mem,
            writable,
            byte_len,
            ..
        } = a
        {
            let writes = *writable && *byte_len > 0;
            match groups.iter_mut().find(|(m, _)| Arc::ptr_eq(m, mem)) {
                Some(g) => g.1 |= writes,
                None => groups.push((mem, writes)),
            }
        }
    }
    groups.sort_by_key(|(m, _)| Arc::as_ptr(m) as usize);
    let mut guards: Vec<Guard<'_>> = Vec::with_capacity(groups.len());
    for (mem, writable) in &groups {
        let h = host_mem(mem)?;
        guards.push(if *writable {
            Guard::Write(h.write())
        } else {
            Guard::Read(h.read())
        });
    }

    let mut slots: Vec<Option<HostSlot<'_>>> = (0..args.len()).map(|_| None).collect();
    for (a, slot) in args.iter().zip(slots.iter_mut()) {
        match a {
            KernelArg::Scalar {
                bytes,
                len,
                ty,
                ty_name,
                ..
            } => {
                *slot = Some(HostSlot::Scalar {
                    bytes: *bytes,
                    len: *len,
                    ty: *ty,
                    ty_name,
                });
            }
            // An empty range, wherever it lies, is an empty slice of its own.
            KernelArg::Buffer {
                byte_len: 0,
                ty,
                ty_name,
                writable,
                ..
            } => {
                *slot = Some(if *writable {
                    HostSlot::Out {
                        bytes: Mutex::new(Some(&mut [])),
                        read: OnceLock::new(),
                        ty: *ty,
                        ty_name,
                    }
                } else {
                    HostSlot::In {
                        bytes: &[],
                        ty: *ty,
                        ty_name,
                    }
                });
            }
            KernelArg::Buffer { .. } => {}
        }
    }
    for ((mem, _), guard) in groups.iter().zip(guards.iter_mut()) {
        // The arguments that use this allocation, by offset.
        let mut members: Vec<(usize, usize, usize)> = args
            .iter()
            .enumerate()
            .filter_map(|(i, a)| match a {
                KernelArg::Buffer {
                    mem: m,
                    byte_offset,
                    byte_len,
                    ..
                } if *byte_len > 0 && Arc::ptr_eq(m, mem) => Some((i, *byte_offset, *byte_len)),
                _ => None,
            })
            .collect();
        // By offset (empty ranges have their slices already).
        members.sort_by_key(|&(_, off, len)| (off, len));
        match guard {
            Guard::Read(g) => {
                let whole: &[u8] = bytemuck::cast_slice(&g[..]);
                for (i, off, len) in members {
                    let KernelArg::Buffer { ty, ty_name, .. } = &args[i] else {
                        continue;
                    };
                    slots[i] = Some(HostSlot::In {
                        bytes: &whole[off..off + len],
                        ty: *ty,
                        ty_name,
                    });
                }
            }
            Guard::Write(g) => {
                let mut rest: &mut [u8] = bytemuck::cast_slice_mut(&mut g[..]);
                let mut cursor = 0usize;
                for (i, off, len) in members {
                    if off < cursor {
                        return Err(DeviceError::InvalidArgument {
                            kernel: name.to_string(),
                            index: i,
                            reason: "overlaps another argument of the same buffer that the \
                                     kernel writes"
                                .into(),
                        });
                    }
                    let tail = std::mem::take(&mut rest);
                    let (_, tail) = tail.split_at_mut(off - cursor);
                    let (piece, tail) = tail.split_at_mut(len);
                    rest = tail;
                    cursor = off + len;
                    let KernelArg::Buffer {
                        ty,
                        ty_name,
                        writable,
                        ..
                    } = &args[i]
                    else {
                        continue;
                    };
                    slots[i] = Some(if *writable {
                        HostSlot::Out {
                            bytes: Mutex::new(Some(piece)),
                            read: OnceLock::new(),
                            ty: *ty,
                            ty_name,
                        }
                    } else {
                        HostSlot::In {
                            bytes: piece,
                            ty: *ty,
                            ty_name,
                        }
                    });
                }
            }
        }
    }
    let slots: Vec<HostSlot<'_>> = slots.into_iter().flatten().collect();
    if slots.len() != args.len() {
        return Err(DeviceError::internal(format!(
            "an argument of kernel `{name}` was not bound on the host backend"
        )));
    }
    let mut host_args = HostKernelArgs {
        kernel: name,
        config,
        slots,
    };
    f(&mut host_args)
}
