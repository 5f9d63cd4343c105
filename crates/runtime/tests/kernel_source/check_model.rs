//! A model of the documented check of a launch's arguments against the parameters a
//! source declares: what each parameter accepts, the merge of several declarations, and the
//! argument a launch is refused at.

use rand::rngs::StdRng;
use rand::Rng;

use super::*;

/// What the documented check accepts for an element behind a pointer, or for a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accepts {
    /// A plain C type: a Rust type of that plain type (integers of either signedness), or a
    /// type the check does not know by name of its size.
    Plain(Plain),
    /// Any type of this many bytes: a vector type, a pointer, a value named through an alias.
    Size(usize),
    /// Any type whose size is a whole multiple of this: elements named through an alias, or of
    /// a struct of one plain type.
    Multiple(usize),
    /// Any type: one the check does not know, or declarations that disagree on it.
    Any,
}

impl Accepts {
    pub fn takes(self, ty: RustTy) -> bool {
        match self {
            Accepts::Plain(p) => match ty.plain() {
                Some(q) => q == p,
                None => ty.size() == p.size(),
            },
            Accepts::Size(n) => ty.size() == n,
            Accepts::Multiple(n) => ty.size().is_multiple_of(n),
            Accepts::Any => true,
        }
    }

    /// The same, where another declaration says `other`: known only where they agree.
    pub fn merge(self, other: Accepts) -> Accepts {
        if self == other {
            self
        } else {
            Accepts::Any
        }
    }
}

/// One parameter as the documented check sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamModel {
    Pointer {
        writable: bool,
        elem: Accepts,
    },
    Value(Accepts),
    /// Declarations disagree on it (or on the number of parameters, or one cannot be read):
    /// an input buffer goes here only where every declaration makes it a pointer to `const`.
    Disputed {
        read_only: bool,
    },
    /// It names a type the check cannot resolve: every argument is refused.
    Unresolved,
}

impl ParamModel {
    pub fn takes(self, arg: ArgSpec) -> bool {
        match (self, arg) {
            (
                ParamModel::Pointer { writable, elem },
                ArgSpec::Buffer {
                    ty, writable: w, ..
                },
            ) => (w || !writable) && elem.takes(ty),
            (ParamModel::Value(elem), ArgSpec::Scalar(ty)) => elem.takes(ty),
            (ParamModel::Disputed { read_only }, ArgSpec::Buffer { writable, .. }) => {
                writable || read_only
            }
            (ParamModel::Disputed { .. }, ArgSpec::Scalar(_)) => true,
            _ => false,
        }
    }

    pub fn read_only(self) -> bool {
        matches!(
            self,
            ParamModel::Pointer {
                writable: false,
                ..
            }
        )
    }

    /// Two declarations of one parameter as one: `None` where they disagree on
    /// pointer-vs-value.
    pub fn merge(self, other: ParamModel) -> Option<ParamModel> {
        match (self, other) {
            (
                ParamModel::Pointer {
                    writable: wa,
                    elem: ea,
                },
                ParamModel::Pointer {
                    writable: wb,
                    elem: eb,
                },
            ) => Some(ParamModel::Pointer {
                writable: wa || wb,
                elem: ea.merge(eb),
            }),
            (ParamModel::Value(ea), ParamModel::Value(eb)) => Some(ParamModel::Value(ea.merge(eb))),
            _ => None,
        }
    }
}

/// What the documented check knows of a kernel's parameters, from the parameters of each
/// declaration it reads (`None`: one that cannot be read). Where the declarations disagree on
/// the number of parameters, or one cannot be read, every parameter is disputed; where they
/// disagree on pointer-vs-value, that one; a type name unresolved in one is unresolved.
pub fn merged(declarations: &[Option<Vec<ParamModel>>]) -> Vec<ParamModel> {
    let read: Vec<&Vec<ParamModel>> = declarations.iter().flatten().collect();
    let unreadable = read.len() < declarations.len();
    let count = read.iter().map(|d| d.len()).max().unwrap_or(0);
    let agree = !unreadable && read.iter().all(|d| d.len() == count);
    if read.is_empty() || (count == 0 && !agree) {
        return vec![ParamModel::Disputed { read_only: false }];
    }
    (0..count)
        .map(|i| {
            let at: Vec<Option<ParamModel>> = read.iter().map(|d| d.get(i).copied()).collect();
            if at.contains(&Some(ParamModel::Unresolved)) {
                return ParamModel::Unresolved;
            }
            let read_only = !unreadable && at.iter().all(|p| p.is_some_and(ParamModel::read_only));
            let disputed = ParamModel::Disputed { read_only };
            if !agree {
                return disputed;
            }
            let mut declared = at.iter().flatten().copied();
            let first = declared.next().unwrap_or(disputed);
            declared
                .try_fold(first, ParamModel::merge)
                .unwrap_or(disputed)
        })
        .collect()
}

/// Scalars larger than this are refused when the arguments are built.
pub const MAX_SCALAR: usize = 16;

/// `None` when the check accepts `args` for `params`, else the index of the argument refused.
pub fn refused_at(params: &[ParamModel], args: &[ArgSpec]) -> Option<usize> {
    let too_large = args
        .iter()
        .position(|a| matches!(a, ArgSpec::Scalar(ty) if ty.size() > MAX_SCALAR));
    if too_large.is_some() {
        return too_large;
    }
    let counted = !params
        .iter()
        .any(|p| matches!(p, ParamModel::Disputed { .. }));
    if counted && params.len() != args.len() {
        return Some(params.len().min(args.len()));
    }
    let beyond = ParamModel::Disputed { read_only: false };
    (0..args.len()).find(|&i| !params.get(i).copied().unwrap_or(beyond).takes(args[i]))
}

/// Arguments that each pass their parameter where some Rust type here can, and are random
/// where none can.
pub fn fitting_args(rng: &mut StdRng, params: &[ParamModel]) -> Vec<ArgSpec> {
    params
        .iter()
        .map(|&p| {
            let fits: Vec<RustTy> = RustTy::ALL
                .iter()
                .copied()
                .filter(|&ty| match p {
                    ParamModel::Pointer { elem, .. } => elem.takes(ty),
                    ParamModel::Value(elem) => ty.size() <= MAX_SCALAR && elem.takes(ty),
                    ParamModel::Disputed { .. } | ParamModel::Unresolved => false,
                })
                .collect();
            let Some(&ty) = fits.get(rng.gen_range(0..fits.len().max(1))) else {
                return ArgSpec::random(rng);
            };
            match p {
                ParamModel::Pointer { writable, .. } => ArgSpec::Buffer {
                    ty,
                    len: [0, 1, 3][rng.gen_range(0..3)],
                    writable: writable || rng.gen(),
                },
                _ => ArgSpec::Scalar(ty),
            }
        })
        .collect()
}

/// `args` with one change at random: an argument added or removed, a buffer for a scalar or
/// the reverse, an input for an output, another element or scalar type.
pub fn changed(rng: &mut StdRng, args: &[ArgSpec]) -> Vec<ArgSpec> {
    let mut args = args.to_vec();
    let at = rng.gen_range(0..=args.len());
    let other_ty = |rng: &mut StdRng| RustTy::ALL[rng.gen_range(0..RustTy::ALL.len())];
    if at == args.len() || rng.gen_ratio(1, 8) {
        if !args.is_empty() && rng.gen() {
            args.remove(rng.gen_range(0..args.len()));
        } else {
            args.insert(at, ArgSpec::random(rng));
        }
        return args;
    }
    args[at] = match (args[at], rng.gen_range(0..3)) {
        (ArgSpec::Buffer { ty, .. }, 0) => ArgSpec::Scalar(ty),
        (ArgSpec::Scalar(ty), 0) => ArgSpec::Buffer {
            ty,
            len: 1,
            writable: rng.gen(),
        },
        (ArgSpec::Buffer { ty, len, writable }, 1) => ArgSpec::Buffer {
            ty,
            len,
            writable: !writable,
        },
        (ArgSpec::Buffer { len, writable, .. }, _) => ArgSpec::Buffer {
            ty: other_ty(rng),
            len,
            writable,
        },
        (ArgSpec::Scalar(_), _) => ArgSpec::Scalar(other_ty(rng)),
    };
    args
}
