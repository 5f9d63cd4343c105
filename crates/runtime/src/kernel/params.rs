//! The parameters a kernel's CUDA C source declares, and the check of a launch's arguments
//! against them.
//!
//! The signature of `extern "C" __global__ void NAME(...)` is read from the source once per
//! kernel. For each parameter it gives whether it is a pointer, whether the elements it points
//! to are `const`, and, where the type is one of CUDA C's plain types (`float`, `double`,
//! `__half`, `__nv_bfloat16`, the integer types and their `<stdint.h>` names), its element
//! type. A launch is then refused with [`DeviceError::InvalidArgument`] naming the parameter
//! when it passes a different number of arguments, a buffer where a value is declared (or the
//! reverse), an input buffer for a pointer to elements that are not `const` (the kernel may
//! write through it, while an input is ordered as a read, concurrent with other readers), a
//! buffer of another element type, or a scalar of another size or kind (an `f32` where the
//! source says `double`). Integers of the same size but another signedness are accepted; an
//! element or value type the check does not know by name (a user's `Pod` struct) is accepted
//! for a plain C type of the same size only. Types the reader does not know (templates,
//! structs, vector types) are checked by kind (pointer or value) and, for pointers, by
//! `const`-ness; a source whose signature cannot be read is not checked here.
//!
//! The check runs on both backends, so that the host backend refuses what CUDA would
//! misread.

use std::any::TypeId;

use super::KernelArg;
use crate::error::{DeviceError, Result};

/// A plain element type of CUDA C, as the check compares them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Plain {
    /// A floating-point type of this many bytes, or the 2-byte bfloat16.
    Float(u8),
    BFloat16,
    /// An integer type of this many bytes (either signedness), or `bool`.
    Int(u8),
    Bool,
}

impl Plain {
    fn of_c(words: &[&str]) -> Option<Plain> {
        let words: Vec<&str> = words
            .iter()
            .copied()
            .filter(|w| !matches!(*w, "signed" | "int") || words.len() == 1)
            .collect();
        let joined = words.join(" ");
        Some(match joined.as_str() {
            "float" => Plain::Float(4),
            "double" => Plain::Float(8),
            "__half" | "half" => Plain::Float(2),
            "__nv_bfloat16" | "nv_bfloat16" => Plain::BFloat16,
            "bool" => Plain::Bool,
            "char" | "unsigned char" | "int8_t" | "uint8_t" => Plain::Int(1),
            "short" | "unsigned short" | "int16_t" | "uint16_t" => Plain::Int(2),
            "int" | "unsigned" | "unsigned int" | "int32_t" | "uint32_t" | "" => Plain::Int(4),
            "long long" | "unsigned long long" | "int64_t" | "uint64_t" | "size_t"
            | "ptrdiff_t" | "long" | "unsigned long" => Plain::Int(8),
            _ => return None,
        })
    }

    /// The plain type of the Rust type `T`, if it is one: computed where a launch's argument
    /// is built, where `T` is known, so that the check of the launch compares two `Plain`s.
    #[inline]
    pub(crate) fn of_rust<T: 'static>() -> Option<Plain> {
        let ty = TypeId::of::<T>();
        let size = std::mem::size_of::<T>();
        let floats = [
            (TypeId::of::<f32>(), Plain::Float(4)),
            (TypeId::of::<f64>(), Plain::Float(8)),
            (TypeId::of::<half::f16>(), Plain::Float(2)),
            (TypeId::of::<half::bf16>(), Plain::BFloat16),
        ];
        let ints = [
            TypeId::of::<i8>(),
            TypeId::of::<u8>(),
            TypeId::of::<i16>(),
            TypeId::of::<u16>(),
            TypeId::of::<i32>(),
            TypeId::of::<u32>(),
            TypeId::of::<i64>(),
            TypeId::of::<u64>(),
            TypeId::of::<isize>(),
            TypeId::of::<usize>(),
        ];
        if let Some((_, p)) = floats.iter().find(|(t, _)| *t == ty) {
            Some(*p)
        } else if ints.contains(&ty) {
            // At most 8: the integer types listed.
            Some(Plain::Int(size as u8))
        } else if ty == TypeId::of::<bool>() {
            Some(Plain::Bool)
        } else {
            None
        }
    }

    /// Bytes of one element.
    fn size(self) -> usize {
        match self {
            Plain::Float(n) | Plain::Int(n) => usize::from(n),
            Plain::BFloat16 => 2,
            Plain::Bool => 1,
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Plain::Float(2) => "a 16-bit float",
            Plain::Float(4) => "a 32-bit float",
            Plain::Float(_) => "a 64-bit float",
            Plain::BFloat16 => "a bfloat16",
            Plain::Int(1) => "an 8-bit integer",
            Plain::Int(2) => "a 16-bit integer",
            Plain::Int(4) => "a 32-bit integer",
            Plain::Int(_) => "a 64-bit integer",
            Plain::Bool => "a bool",
        }
    }
}

/// One declared parameter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Param {
    /// The declaration as written, for messages.
    pub(crate) text: String,
    pub(crate) pointer: bool,
    /// For a pointer, whether the kernel may write the elements it points to (they are not
    /// declared `const`: `float* x`, `float* const x`; not `const float* x`).
    pub(crate) writable: bool,
    /// The (pointee) type, when it is a plain type.
    pub(crate) plain: Option<Plain>,
}

/// The parameters of `extern "C" __global__ void name(...)` in `source`, or `None` when the
/// signature cannot be found or read.
pub(crate) fn parse(source: &str, name: &str) -> Option<Vec<Param>> {
    let source = strip_comments(source);
    let mut from = 0;
    while let Some(found) = source[from..].find("__global__") {
        let start = from + found + "__global__".len();
        from = start;
        // `__global__ [__launch_bounds__(..)] void NAME (` : find NAME( before the next `{`.
        let head_end = source[start..]
            .find('{')
            .map_or(source.len(), |i| start + i);
        let head = &source[start..head_end];
        let Some(pos) = find_ident(head, name) else {
            continue;
        };
        let after = head[pos + name.len()..].trim_start();
        if !after.starts_with('(') {
            continue;
        }
        let open = head.len() - after.len();
        let close = matching_paren(head, open)?;
        let list = head[open + 1..close].trim();
        if list.is_empty() || list == "void" {
            return Some(Vec::new());
        }
        return split_top_level(list)
            .map(|p| parse_param(p.trim()))
            .collect();
    }
    None
}

fn strip_comments(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix("//") {
            rest = r.find('\n').map_or("", |i| &r[i..]);
        } else if let Some(r) = rest.strip_prefix("/*") {
            rest = r.find("*/").map_or("", |i| &r[i + 2..]);
            out.push(' ');
        } else {
            let c = rest.chars().next().unwrap_or(' ');
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

/// The byte offset of `name` in `text` as a whole identifier.
fn find_ident(text: &str, name: &str) -> Option<usize> {
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut from = 0;
    while let Some(i) = text[from..].find(name) {
        let at = from + i;
        let before = text[..at].chars().next_back().is_none_or(|c| !is_ident(c));
        let after = text[at + name.len()..]
            .chars()
            .next()
            .is_none_or(|c| !is_ident(c));
        if before && after {
            return Some(at);
        }
        from = at + name.len();
    }
    None
}

fn matching_paren(text: &str, open: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (i, c) in text[open..].char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return Some(open + i);
                }
            }
            _ => {}
        }
    }
    None
}

fn split_top_level(list: &str) -> impl Iterator<Item = &str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in list.char_indices() {
        match c {
            '(' | '<' | '[' => depth += 1,
            ')' | '>' | ']' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&list[start..]);
    parts.into_iter()
}

fn parse_param(text: &str) -> Option<Param> {
    if text.is_empty() {
        return None;
    }
    let pointer = text.contains('*') || text.contains('[');
    // The elements are `const` when `const` qualifies them: before the first `*` (or `[`);
    // a `const` after it makes the pointer itself constant, not what it points to.
    let pointee = text.find(['*', '[']).map_or(text, |at| &text[..at]);
    let writable = pointer && !pointee.split_whitespace().any(|w| w == "const");
    let spaced = text.replace(['*', '&', '[', ']'], " ");
    let mut words: Vec<&str> = spaced
        .split_whitespace()
        .filter(|w| {
            !matches!(
                *w,
                "const" | "volatile" | "__restrict__" | "restrict" | "__restrict" | "struct"
            )
        })
        .collect();
    // The last word is the parameter's name, where one is given.
    if words.len() > 1 {
        words.pop();
    }
    Some(Param {
        text: text.split_whitespace().collect::<Vec<_>>().join(" "),
        pointer,
        writable,
        plain: Plain::of_c(&words),
    })
}

/// Whether an element (or a value) whose Rust type is the plain type `got` (`None`: a type the
/// check does not know by name), `size` bytes, passes for the plain C type `want`: it is that
/// type, or a type the check does not know by name (a user's `Pod` struct) of the same size.
#[inline]
fn type_matches(want: Plain, got: Option<Plain>, size: usize) -> bool {
    match got {
        Some(got) => got == want,
        None => size == want.size(),
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
    /// An element or value type other than the declared plain type.
    Type(Plain),
}

/// How `arg` fails `param`, if it does: the one test of the launch path and of its error.
#[inline]
fn mismatch<M>(param: &Param, arg: &KernelArg<M>) -> Option<Mismatch> {
    let (plain, size) = match arg {
        KernelArg::Buffer {
            plain,
            elem_size,
            writable,
            ..
        } => {
            if !param.pointer {
                return Some(Mismatch::BufferForValue);
            }
            if param.writable && !*writable {
                return Some(Mismatch::InputForWritable);
            }
            (*plain, *elem_size)
        }
        KernelArg::Scalar { plain, len, .. } => {
            if param.pointer {
                return Some(Mismatch::ValueForPointer);
            }
            (*plain, usize::from(*len))
        }
    };
    let want = param.plain?;
    (!type_matches(want, plain, size)).then_some(Mismatch::Type(want))
}

/// Checks the arguments of a launch of `kernel` against its declared `params`.
#[inline]
pub(crate) fn check<M>(kernel: &str, params: &[Param], args: &[KernelArg<M>]) -> Result<()> {
    if args.len() == params.len()
        && params
            .iter()
            .zip(args)
            .all(|(p, a)| mismatch(p, a).is_none())
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
    if args.len() != params.len() {
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
    for (index, (param, arg)) in params.iter().zip(args).enumerate() {
        let Some(m) = mismatch(param, arg) else {
            continue;
        };
        let text = &param.text;
        let reason = match (arg, m) {
            (KernelArg::Buffer { ty_name, .. }, Mismatch::BufferForValue) => {
                format!("parameter `{text}` is a value, but a buffer of {ty_name} was given")
            }
            (KernelArg::Buffer { ty_name, .. }, Mismatch::InputForWritable) => format!(
                "parameter `{text}` points to elements that are not const, so the kernel may \
                 write them, but a buffer of {ty_name} was given as an input (ordered as a \
                 read, beside other readers); pass it with KernelArgs::output, or declare the \
                 parameter `const`"
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
                want.describe(),
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
                want.describe(),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_are_read_from_cuda_c() {
        let src = r#"
            // a comment with __global__ void k(int) in it
            template <typename T> __device__ T twice(T x) { return x + x; }
            extern "C" __global__ void __launch_bounds__(256)
            k(const float* __restrict__ x, double* out, unsigned n, long long m,
              __nv_bfloat16 b, float4 v, T* t) { }
        "#;
        let params = parse(src, "k").expect("a signature");
        let kinds: Vec<(bool, Option<Plain>)> =
            params.iter().map(|p| (p.pointer, p.plain)).collect();
        assert_eq!(
            kinds,
            vec![
                (true, Some(Plain::Float(4))),
                (true, Some(Plain::Float(8))),
                (false, Some(Plain::Int(4))),
                (false, Some(Plain::Int(8))),
                (false, Some(Plain::BFloat16)),
                (false, None),
                (true, None),
            ]
        );
        let writable: Vec<bool> = params.iter().map(|p| p.writable).collect();
        assert_eq!(
            writable,
            vec![false, true, false, false, false, false, true]
        );
        let consts = parse(
            "extern \"C\" __global__ void k(float const* a, float* const b, const int c[], int d[]) {}",
            "k",
        )
        .expect("a signature");
        let writable: Vec<bool> = consts.iter().map(|p| p.writable).collect();
        assert_eq!(writable, vec![false, true, false, true]);
        assert_eq!(
            parse("extern \"C\" __global__ void k(void) {}", "k"),
            Some(vec![])
        );
        assert_eq!(parse("__global__ void other(int n) {}", "k"), None);
    }
}
