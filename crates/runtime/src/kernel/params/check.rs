//! The check of a launch's arguments against the parameters read from the source (see the
//! [parent module](super)).

use super::super::KernelArg;
use super::{Elem, Kind, Param, Plain, UNDECLARED};
use crate::error::{DeviceError, Result};

/// Whether an element (or a value) whose Rust type is the plain type `got` (`None`: a type the
/// check does not know by name), `size` bytes, passes for the element type `want`: it is that
/// plain type, or a type the check does not know by name (a user's `Pod` struct) of the same
/// size; for a type known by its size only, any type of that size; for elements named
/// through an alias, any type whose size is a whole multiple of theirs.
#[inline]
fn elem_matches(want: Elem, got: Option<Plain>, size: usize) -> bool {
    match (want, got) {
        (Elem::Plain(want), Some(got)) => got == want,
        (Elem::Plain(want), None) => size == want.size(),
        (Elem::Sized(bytes), _) => usize::try_from(bytes) == Ok(size),
        (Elem::Storage(bytes), _) => {
            size != 0 && usize::try_from(bytes).is_ok_and(|b| size.is_multiple_of(b.max(1)))
        }
        (Elem::Unknown, _) => true,
    }
}

/// How an argument fails the check against its parameter; found without building a message.
#[derive(Clone, Copy, Debug)]
enum Mismatch {
    /// A buffer for a value parameter.
    BufferForValue,
    /// A value for a pointer parameter.
    ValueForPointer,
    /// An input buffer for a pointer to non-`const` elements.
    InputForWritable,
    /// An input buffer for a parameter that not every declaration makes a pointer to `const`.
    InputForDisputed,
    /// An element or value type other than the declared one.
    Type(Elem),
    /// Any argument, for a parameter that names a type alias the check cannot resolve.
    Unresolved,
}

/// How `arg` fails a parameter of kind `kind`, if it does: the one test of the launch path
/// and of its error.
#[inline]
fn mismatch<M>(kind: &Kind, arg: &KernelArg<M>) -> Option<Mismatch> {
    let (want, plain, size) = match (kind, arg) {
        (Kind::Unresolved, _) => return Some(Mismatch::Unresolved),
        (Kind::Disputed { read_only }, KernelArg::Buffer { writable, .. }) => {
            return (!*read_only && !*writable).then_some(Mismatch::InputForDisputed);
        }
        (Kind::Disputed { .. }, KernelArg::Scalar { .. }) => return None,
        (Kind::Value(_), KernelArg::Buffer { .. }) => return Some(Mismatch::BufferForValue),
        (Kind::Pointer { .. }, KernelArg::Scalar { .. }) => return Some(Mismatch::ValueForPointer),
        (
            Kind::Pointer { writable, elem },
            KernelArg::Buffer {
                plain,
                elem_size,
                writable: output,
                ..
            },
        ) => {
            if *writable && !*output {
                return Some(Mismatch::InputForWritable);
            }
            (*elem, *plain, *elem_size)
        }
        (Kind::Value(elem), KernelArg::Scalar { plain, len, .. }) => {
            (*elem, *plain, usize::from(*len))
        }
    };
    (!elem_matches(want, plain, size)).then_some(Mismatch::Type(want))
}

/// The kind of parameter `index`: [`UNDECLARED`] past the end of a disputed signature.
#[inline]
fn kind_at(params: &[Param], index: usize) -> &Kind {
    params.get(index).map_or(&UNDECLARED, |p| &p.kind)
}

/// Whether the declarations agree on the number of parameters, which is then checked.
#[inline]
fn counted(params: &[Param]) -> bool {
    !params
        .iter()
        .any(|p| matches!(p.kind, Kind::Disputed { .. }))
}

/// Checks the arguments of a launch of `kernel` against its declared `params`.
#[inline]
pub(crate) fn check<M>(kernel: &str, params: &[Param], args: &[KernelArg<M>]) -> Result<()> {
    if (args.len() == params.len() || !counted(params))
        && args
            .iter()
            .enumerate()
            .all(|(i, a)| mismatch(kind_at(params, i), a).is_none())
    {
        return Ok(());
    }
    refusal(kernel, params, args)
}

/// The error of arguments that do not pass [`check`], naming the first one that does not match
/// its parameter.
#[cold]
#[inline(never)]
fn refusal<M>(kernel: &str, params: &[Param], args: &[KernelArg<M>]) -> Result<()> {
    let bad = |index: usize, reason: String| DeviceError::InvalidArgument {
        kernel: kernel.to_string(),
        index,
        reason,
    };
    if args.len() != params.len() && counted(params) {
        let declared: Vec<&str> = params.iter().map(|p| p.text.as_str()).collect();
        return Err(bad(
            args.len().min(params.len()),
            format!(
                "{} arguments were given, but the kernel declares {} parameters ({})",
                args.len(),
                params.len(),
                declared.join(", ")
            ),
        ));
    }
    for (index, arg) in args.iter().enumerate() {
        let Some(m) = mismatch(kind_at(params, index), arg) else {
            continue;
        };
        let text = params
            .get(index)
            .map_or("(not declared by every declaration)", |p| &p.text);
        let reason = match (arg, m) {
            (_, Mismatch::Unresolved) => {
                let alias = params
                    .get(index)
                    .and_then(|p| p.unresolved.as_deref())
                    .unwrap_or("?");
                format!(
                    "parameter `{text}` names the type `{alias}`, which the check cannot \
                     resolve to one type (an alias declared with different types, as in the \
                     branches of an `#if`, an alias template, an array, function or reference \
                     type, aliases that name one another without end, or a name the source \
                     does not declare while one of its function-like macros declares \
                     aliases), so it cannot tell what the \
                     argument must be; declare the parameter with the type itself, or with a \
                     single `typedef`/`using` of a plain or pointer type written out in the \
                     source"
                )
            }
            (KernelArg::Buffer { ty_name, .. }, Mismatch::BufferForValue) => {
                format!("parameter `{text}` is a value, but a buffer of {ty_name} was given")
            }
            (KernelArg::Buffer { ty_name, .. }, Mismatch::InputForWritable) => format!(
                "parameter `{text}` points to elements that are not const, so the kernel may \
                 write them, but a buffer of {ty_name} was given as an input (ordered as a \
                 read, beside other readers); pass it with KernelArgs::output, or declare the \
                 parameter `const`"
            ),
            (KernelArg::Buffer { ty_name, .. }, Mismatch::InputForDisputed) => format!(
                "the source declares the kernel more than once (a prototype, preprocessor \
                 branches) or in a way that cannot be read, and not every declaration makes \
                 parameter {index} (`{text}`) a pointer to const elements, so the kernel may \
                 write it, but a buffer of {ty_name} was given as an input; pass it with \
                 KernelArgs::output"
            ),
            (
                KernelArg::Buffer {
                    ty_name,
                    plain,
                    elem_size,
                    ..
                },
                Mismatch::Type(want),
            ) => format!(
                "parameter `{text}` points to {}, but a buffer of {ty_name} ({}) was given",
                described_elem(want, "elements"),
                described(*plain, *elem_size, "elements"),
            ),
            (KernelArg::Scalar { ty_name, .. }, Mismatch::ValueForPointer) => format!(
                "parameter `{text}` is a pointer, but a {ty_name} value was given; pass a \
                 buffer with KernelArgs::input or KernelArgs::output"
            ),
            (
                KernelArg::Scalar {
                    ty_name,
                    plain,
                    len,
                    ..
                },
                Mismatch::Type(want),
            ) => format!(
                "parameter `{text}` is {}, but a {ty_name} ({}) was given",
                described_elem(want, "value"),
                described(*plain, usize::from(*len), "value"),
            ),
            // `mismatch` gives a buffer only buffer mismatches, a value only value ones.
            (_, m) => format!("parameter `{text}` does not match the argument ({m:?})"),
        };
        return Err(bad(index, reason));
    }
    Ok(())
}

/// What a mismatched element (or value) is, for the message: its plain type, or its size when
/// the check does not know its type by name.
fn described(plain: Option<Plain>, size: usize, unit: &str) -> String {
    match plain {
        Some(p) => p.describe().to_string(),
        None => format!("{size}-byte {unit}"),
    }
}

/// What a declared element (or value) type is, for the message.
fn described_elem(elem: Elem, unit: &str) -> String {
    match elem {
        Elem::Plain(p) => p.describe().to_string(),
        Elem::Sized(bytes) => format!("{bytes}-byte {unit}"),
        Elem::Storage(bytes) => format!(
            "{bytes}-byte {unit} (named through a type alias: elements of a whole multiple of \
             {bytes} bytes are accepted)"
        ),
        Elem::Unknown => format!("{unit} of a type the check does not know"),
    }
}
