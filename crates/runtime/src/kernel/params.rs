//! The parameters a kernel's CUDA C source declares, and the check of a launch's arguments
//! against them.
//!
//! The signature of `extern "C" __global__ void NAME(...)` is read from the source once per
//! kernel. For each parameter it gives whether it is a pointer, whether the elements it points
//! to are `const`, and its element type where it can tell: one of CUDA C's plain types
//! (`float`, `double`, `__half`, `__nv_bfloat16`, the integer types and their `<stdint.h>`
//! names), or a type known by its size (CUDA's vector types, `float4`: 16 bytes; the pointers
//! a `float**` points to: 8 bytes, writable unless a `const` stands right before the last `*`,
//! as in `float* const*`). Only a `const` outside template arguments qualifies the elements
//! (`Pair<const int, float>* p` points to writable pairs).
//!
//! The reader does not run the preprocessor, so it trusts no single declaration: every
//! `__global__` declaration of the kernel (a prototype and its definition, the branches of an
//! `#if`) is read, and the merge lets a pointer be written if any declaration does, knows an
//! element type only where all agree, and, where they disagree on pointer-vs-value or on the
//! number of parameters, or one cannot be read (a directive or a function-like macro inside
//! its parameter list), checks no more than that an input buffer goes to a parameter every
//! declaration makes a pointer to `const` elements. Object-like macros the source defines
//! once are expanded in parameter lists; compile options cannot define any (see
//! [`Kernel::with_compile_option`](super::Kernel::with_compile_option)).
//!
//! A launch is then refused with [`DeviceError::InvalidArgument`] naming the parameter when it
//! passes a different number of arguments, a buffer where a value is declared (or the
//! reverse), an input buffer for a pointer to elements that are not `const` (the kernel may
//! write through it, while an input is ordered as a read, concurrent with other readers), a
//! buffer of another element type, or a scalar of another size or kind (an `f32` where the
//! source says `double`). Integers of the same size but another signedness are accepted; an
//! element or value type the check does not know by name (a user's `Pod` struct) is accepted
//! for a plain C type of the same size only, and any type of the right size for a type known
//! by its size. Types the reader does not know (templates, structs, `typedef`s) are checked by
//! kind (pointer or value) and, for pointers, by `const`-ness; a source in which no
//! declaration of the kernel is found (a macro declares it) is not checked here.
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
        if words.is_empty() {
            return None;
        }
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
            "int" | "signed" | "unsigned" | "unsigned int" | "int32_t" | "uint32_t" | "" => {
                Plain::Int(4)
            }
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

/// What a pointer parameter points to, or what a value parameter is, as far as the check can
/// tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Elem {
    /// One of CUDA C's plain types.
    Plain(Plain),
    /// A type known by its size only: one of CUDA's vector types (`float4`: 16 bytes,
    /// `__half2`: 4), or a pointer (8 bytes: the elements of `float** p`).
    Sized(u8),
    /// A type the check does not know (a template, a struct, a `typedef`).
    Unknown,
}

impl Elem {
    /// The element type named by `words` (qualifiers and the parameter's name removed).
    fn of_c(words: &[&str]) -> Elem {
        if words.is_empty() {
            Elem::Unknown
        } else if let Some(p) = Plain::of_c(words) {
            Elem::Plain(p)
        } else if let [word] = words {
            vector_size(word).map_or(Elem::Unknown, Elem::Sized)
        } else {
            Elem::Unknown
        }
    }
}

/// The size of CUDA's built-in vector type `word` (`float4`, `uchar2`, `__half2`, `dim3`).
fn vector_size(word: &str) -> Option<u8> {
    match word {
        "__half2" | "half2" | "__nv_bfloat162" | "nv_bfloat162" => return Some(4),
        "dim3" => return Some(12),
        _ => {}
    }
    let (base, lanes) = word.split_at(word.len().checked_sub(1)?);
    let lanes: u8 = match lanes {
        "1" => 1,
        "2" => 2,
        "3" => 3,
        "4" => 4,
        _ => return None,
    };
    let bytes: u8 = match base {
        "char" | "uchar" => 1,
        "short" | "ushort" => 2,
        "int" | "uint" | "float" => 4,
        "long" | "ulong" | "longlong" | "ulonglong" | "double" => 8,
        _ => return None,
    };
    Some(bytes * lanes)
}

/// What a parameter is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A value of this type.
    Value(Elem),
    /// A pointer (or an array, which is passed as one).
    Pointer {
        /// Whether the kernel may write the elements it points to: they are not declared
        /// `const` (`float* x`, `float* const x`, `const float** x`; not `const float* x` or
        /// `float* const* x`).
        writable: bool,
        elem: Elem,
    },
    /// The declarations of the kernel disagree about this parameter (a prototype and a
    /// definition, or preprocessor branches), or about the number of parameters, or one of
    /// them could not be read: the only thing known is whether every declaration makes it a
    /// pointer to `const` elements, which an input buffer needs.
    Disputed { read_only: bool },
}

/// One declared parameter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Param {
    /// The declaration as written, for messages.
    pub(crate) text: String,
    pub(crate) kind: Kind,
}

/// What stands at a position no declaration reaches, where the declarations disagree.
const UNDECLARED: Kind = Kind::Disputed { read_only: false };

/// The parameters of `extern "C" __global__ void name(...)` in `source`, or `None` when no
/// declaration of it is found.
///
/// Every `__global__` declaration of `name` is read, whether or not the preprocessor keeps it
/// (a prototype and its definition, the branches of an `#if`), and merged so that the merge
/// trusts no more than each of them: a pointer is writable if one declaration lets the kernel
/// write it, an element type is known if all declarations agree on it, and a position where
/// they disagree on pointer-vs-value (or on the number of parameters) is
/// [`Kind::Disputed`]. A declaration that cannot be read (preprocessing inside its parameter
/// list, a function-like macro in it) disputes every position. Object-like macros the source
/// `#define`s once are expanded in the parameter list.
pub(crate) fn parse(source: &str, name: &str) -> Option<Vec<Param>> {
    let source = strip_comments(source);
    let macros = Macros::of(&source);
    let heads: Vec<Option<Vec<Param>>> = parameter_lists(&source, name)
        .into_iter()
        .map(|list| read_list(list?, &macros))
        .collect();
    merge(heads)
}

/// The parameter list of every `__global__` declaration of `name` (`None`: one whose list
/// does not close).
fn parameter_lists<'s>(source: &'s str, name: &str) -> Vec<Option<&'s str>> {
    let mut lists = Vec::new();
    let mut from = 0;
    while let Some(found) = source[from..].find("__global__") {
        let start = from + found + "__global__".len();
        from = start;
        // `__global__ [__launch_bounds__(..)] void NAME (...)`, ended by its body's `{` or
        // a prototype's `;`.
        let head_end = source[start..]
            .find(['{', ';'])
            .map_or(source.len(), |i| start + i);
        let head = &source[start..head_end];
        let Some(open) = call_of(head, name) else {
            continue;
        };
        lists.push(matching_paren(head, open).map(|close| head[open + 1..close].trim()));
    }
    lists
}

/// The byte offset of the `(` after `name`, where `name` appears in `text` as a whole
/// identifier followed by a parenthesis.
fn call_of(text: &str, name: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(at) = find_ident(&text[from..], name).map(|i| from + i) {
        let after = &text[at + name.len()..];
        if after.trim_start().starts_with('(') {
            return Some(text.len() - after.trim_start().len());
        }
        from = at + name.len();
    }
    None
}

/// The parameters of one declaration's list, or `None` when it cannot be read.
fn read_list(list: &str, macros: &Macros<'_>) -> Option<Vec<Param>> {
    if list.contains('#') {
        return None;
    }
    let list = macros.expand(list)?;
    let list = list.trim();
    if list.is_empty() || list == "void" {
        return Some(Vec::new());
    }
    split_top_level(list)
        .map(|p| parse_param(p.trim()))
        .collect()
}

/// Merges the declarations of one kernel (see [`parse`]).
fn merge(heads: Vec<Option<Vec<Param>>>) -> Option<Vec<Param>> {
    let mut read: Vec<Vec<Param>> = Vec::with_capacity(heads.len());
    let mut unreadable = None;
    for head in heads {
        match head {
            Some(params) => read.push(params),
            None => unreadable = Some(()),
        }
    }
    if read.is_empty() {
        // Found, but unreadable: no input buffer can be known to go to a `const` pointer.
        return unreadable.map(|()| {
            vec![Param {
                text: "(a declaration that could not be read)".into(),
                kind: UNDECLARED,
            }]
        });
    }
    let count = read.iter().map(Vec::len).max().unwrap_or(0);
    let counts_agree = read.iter().all(|p| p.len() == count) && unreadable.is_none();
    let merged = (0..count).map(|i| {
        let at: Vec<Option<&Param>> = read.iter().map(|params| params.get(i)).collect();
        let text = at
            .iter()
            .rev()
            .flatten()
            .next()
            .map_or_else(String::new, |p| p.text.clone());
        let read_only = unreadable.is_none()
            && at.iter().all(|p| {
                matches!(
                    p,
                    Some(Param {
                        kind: Kind::Pointer {
                            writable: false,
                            ..
                        },
                        ..
                    })
                )
            });
        let kinds: Vec<Kind> = at.iter().flatten().map(|p| p.kind).collect();
        let kind = match kinds.split_first() {
            Some((first, rest)) if counts_agree => rest
                .iter()
                .try_fold(*first, |a, b| merge_kind(a, *b))
                .unwrap_or(Kind::Disputed { read_only }),
            _ => Kind::Disputed { read_only },
        };
        Param { text, kind }
    });
    let mut merged: Vec<Param> = merged.collect();
    if merged.is_empty() && !counts_agree {
        merged.push(Param {
            text: "(declarations that disagree)".into(),
            kind: UNDECLARED,
        });
    }
    Some(merged)
}

/// Two declarations of one parameter as one, or `None` where they disagree on pointer-vs-value.
fn merge_kind(a: Kind, b: Kind) -> Option<Kind> {
    let elem = |x: Elem, y: Elem| if x == y { x } else { Elem::Unknown };
    match (a, b) {
        (Kind::Value(x), Kind::Value(y)) => Some(Kind::Value(elem(x, y))),
        (
            Kind::Pointer {
                writable: wa,
                elem: x,
            },
            Kind::Pointer {
                writable: wb,
                elem: y,
            },
        ) => Some(Kind::Pointer {
            writable: wa || wb,
            elem: elem(x, y),
        }),
        _ => None,
    }
}

/// The object-like macros a source `#define`s, for expansion in parameter lists.
struct Macros<'s> {
    /// Each name with its body; `None` for a function-like macro, one defined twice with
    /// other bodies, or one `#undef`ined: a parameter list naming it cannot be read.
    defined: std::collections::HashMap<&'s str, Option<String>>,
}

impl<'s> Macros<'s> {
    fn of(source: &'s str) -> Macros<'s> {
        let mut defined = std::collections::HashMap::new();
        let mut lines = source.lines();
        while let Some(line) = lines.next() {
            let Some(directive) = line.trim_start().strip_prefix('#') else {
                continue;
            };
            let directive = directive.trim_start();
            let (undef, rest) = if let Some(r) = directive.strip_prefix("define") {
                (false, r)
            } else if let Some(r) = directive.strip_prefix("undef") {
                (true, r)
            } else {
                continue;
            };
            if !rest.starts_with([' ', '\t']) {
                continue;
            }
            let rest = rest.trim_start();
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            let (name, after) = rest.split_at(end);
            if name.is_empty() {
                continue;
            }
            // The body runs over continued lines.
            let mut body = after.to_string();
            while body.trim_end().ends_with('\\') {
                let cut = body.trim_end().len() - 1;
                body.truncate(cut);
                body.push(' ');
                body.push_str(lines.next().unwrap_or(""));
            }
            let body = (!undef && !after.starts_with('(')).then(|| body.trim().to_string());
            defined
                .entry(name)
                .and_modify(|b: &mut Option<String>| {
                    if *b != body {
                        *b = None;
                    }
                })
                .or_insert(body);
        }
        Macros { defined }
    }

    /// `list` with its object-like macros expanded, or `None` when it names a macro that
    /// cannot be expanded so.
    fn expand(&self, list: &str) -> Option<String> {
        let mut text = list.to_string();
        // Bounded: a macro that names itself stays unexpanded in C; here it is unreadable.
        for _ in 0..16 {
            let mut out = String::with_capacity(text.len());
            let mut changed = false;
            let mut rest = text.as_str();
            while let Some(c) = rest.chars().next() {
                if c.is_ascii_alphabetic() || c == '_' {
                    let end = rest
                        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                        .unwrap_or(rest.len());
                    let word = &rest[..end];
                    match self.defined.get(word) {
                        Some(Some(body)) => {
                            out.push(' ');
                            out.push_str(body);
                            out.push(' ');
                            changed = true;
                        }
                        Some(None) => return None,
                        None => out.push_str(word),
                    }
                    rest = &rest[end..];
                } else {
                    out.push(c);
                    rest = &rest[c.len_utf8()..];
                }
            }
            if !changed {
                return Some(out);
            }
            text = out;
        }
        None
    }
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

/// Whether `text` has the word `const` outside angle brackets (in `Pair<const int, float>`
/// it qualifies a template argument, not the elements).
fn has_outer_const(text: &str) -> bool {
    let (mut depth, mut start) = (0i32, None);
    for (i, c) in text.char_indices().chain([(text.len(), ' ')]) {
        if c.is_ascii_alphanumeric() || c == '_' {
            start = start.or(Some(i));
            continue;
        }
        if let Some(s) = start.take() {
            if depth == 0 && &text[s..i] == "const" {
                return true;
            }
        }
        match c {
            '<' => depth += 1,
            '>' => depth -= 1,
            _ => {}
        }
    }
    false
}

fn parse_param(text: &str) -> Option<Param> {
    if text.is_empty() {
        return None;
    }
    let shown = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let param = |kind| {
        Some(Param {
            text: shown.clone(),
            kind,
        })
    };
    if text.contains('(') {
        // A function pointer, or a call in the declaration: nothing more is read from it.
        return if text.contains('*') {
            param(Kind::Pointer {
                writable: true,
                elem: Elem::Unknown,
            })
        } else {
            param(Kind::Value(Elem::Unknown))
        };
    }
    // The levels of indirection outside template arguments: `*`s, then `[`s.
    let mut depth = 0i32;
    let (mut stars, mut brackets) = (Vec::new(), Vec::new());
    for (i, c) in text.char_indices() {
        match c {
            '<' => depth += 1,
            '>' => depth -= 1,
            '*' if depth == 0 => stars.push(i),
            '[' if depth == 0 => brackets.push(i),
            _ => {}
        }
    }
    let (last_star, first_bracket) = (stars.last().copied(), brackets.first().copied());
    let Some(level) = first_bracket.or(last_star) else {
        return param(Kind::Value(Elem::of_c(&type_words(text, true))));
    };
    // The pointer passed is the first array level (`int c[]`, `float* p[]`), else the last `*`
    // (`float* x`, `const float** p`); its elements' qualifiers stand between it and the level
    // before it.
    let qualifiers_from = match first_bracket {
        Some(_) => last_star.map_or(0, |s| s + 1),
        None => stars.iter().rev().nth(1).map_or(0, |s| s + 1),
    };
    let writable = !has_outer_const(&text[qualifiers_from..level]);
    let elem = match (stars.len(), brackets.len()) {
        // The elements are pointers, or arrays.
        (_, 2..) => Elem::Unknown,
        (1.., 1) | (2.., 0) => Elem::Sized(8),
        // `const int c[]` names its parameter before the bracket; `int* x` after the star.
        (0, _) => Elem::of_c(&type_words(&text[..level], true)),
        (_, 0) => Elem::of_c(&type_words(&text[..level], false)),
    };
    param(Kind::Pointer { writable, elem })
}

/// The words of the type in `text`, without its qualifiers and, where `named` and one is
/// given, the parameter's name: the last word, unless it belongs to the type (`unsigned
/// short` has no name). Empty for a template.
fn type_words(text: &str, named: bool) -> Vec<&str> {
    if text.contains(['<', ':']) {
        return Vec::new();
    }
    let mut words: Vec<&str> = text
        .split(|c: char| c.is_whitespace() || matches!(c, '&'))
        .filter(|w| {
            !w.is_empty()
                && !matches!(
                    *w,
                    "const"
                        | "volatile"
                        | "__restrict__"
                        | "restrict"
                        | "__restrict"
                        | "struct"
                        | "__grid_constant__"
                )
        })
        .collect();
    let type_word = |w: &str| {
        matches!(
            w,
            "int"
                | "char"
                | "short"
                | "long"
                | "unsigned"
                | "signed"
                | "float"
                | "double"
                | "bool"
                | "void"
        ) || Plain::of_c(&[w]).is_some()
            || vector_size(w).is_some()
    };
    if named && words.len() > 1 && words.last().is_some_and(|w| !type_word(w)) {
        words.pop();
    }
    words
}

/// Whether an element (or a value) whose Rust type is the plain type `got` (`None`: a type the
/// check does not know by name), `size` bytes, passes for the element type `want`: it is that
/// plain type, or a type the check does not know by name (a user's `Pod` struct) of the same
/// size; for a type known by its size only, any type of that size.
#[inline]
fn elem_matches(want: Elem, got: Option<Plain>, size: usize) -> bool {
    match (want, got) {
        (Elem::Plain(want), Some(got)) => got == want,
        (Elem::Plain(want), None) => size == want.size(),
        (Elem::Sized(bytes), _) => size == usize::from(bytes),
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
}

/// How `arg` fails a parameter of kind `kind`, if it does: the one test of the launch path
/// and of its error.
#[inline]
fn mismatch<M>(kind: &Kind, arg: &KernelArg<M>) -> Option<Mismatch> {
    let (want, plain, size) = match (kind, arg) {
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
        Elem::Unknown => format!("{unit} of a type the check does not know"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(src: &str) -> Vec<Kind> {
        parse(src, "k")
            .expect("a signature")
            .into_iter()
            .map(|p| p.kind)
            .collect()
    }

    fn pointer(writable: bool, elem: Elem) -> Kind {
        Kind::Pointer { writable, elem }
    }

    #[test]
    fn signatures_are_read_from_cuda_c() {
        let src = r#"
            // a comment with __global__ void k(int) in it
            template <typename T> __device__ T twice(T x) { return x + x; }
            extern "C" __global__ void __launch_bounds__(256)
            k(const float* __restrict__ x, double* out, unsigned n, long long m,
              __nv_bfloat16 b, float4 v, T* t) { }
        "#;
        assert_eq!(
            kinds(src),
            vec![
                pointer(false, Elem::Plain(Plain::Float(4))),
                pointer(true, Elem::Plain(Plain::Float(8))),
                Kind::Value(Elem::Plain(Plain::Int(4))),
                Kind::Value(Elem::Plain(Plain::Int(8))),
                Kind::Value(Elem::Plain(Plain::BFloat16)),
                Kind::Value(Elem::Sized(16)),
                pointer(true, Elem::Unknown),
            ]
        );
        let int = Elem::Plain(Plain::Int(4));
        assert_eq!(
            kinds(
                "extern \"C\" __global__ void k(float const* a, float* const b, const int c[], \
                 int d[]) {}"
            )
            .iter()
            .map(|k| matches!(k, Kind::Pointer { writable: true, .. }))
            .collect::<Vec<_>>(),
            vec![false, true, false, true]
        );
        assert_eq!(
            kinds("extern \"C\" __global__ void k(const int c[], unsigned short, signed) {}"),
            vec![
                pointer(false, int),
                Kind::Value(Elem::Plain(Plain::Int(2))),
                Kind::Value(int)
            ]
        );
        assert_eq!(
            parse("extern \"C\" __global__ void k(void) {}", "k"),
            Some(vec![])
        );
        assert_eq!(parse("__global__ void other(int n) {}", "k"), None);
    }

    #[test]
    fn indirection_beyond_one_level_points_to_pointers() {
        assert_eq!(
            kinds(
                "extern \"C\" __global__ void k(const float** a, float* const* b, \
                 const float* const* c, float* d[], const float* const e[], int f[][4]) {}"
            ),
            vec![
                pointer(true, Elem::Sized(8)),
                pointer(false, Elem::Sized(8)),
                pointer(false, Elem::Sized(8)),
                pointer(true, Elem::Sized(8)),
                pointer(false, Elem::Sized(8)),
                pointer(true, Elem::Unknown),
            ]
        );
    }

    #[test]
    fn declarations_are_merged_and_macros_expanded() {
        let src = "#define IN const float* __restrict__\n#define REAL double\n\
                   extern \"C\" __global__ void k(IN x, REAL* y, int n);\n\
                   #ifdef A\n extern \"C\" __global__ void k(const float* x, float* y, int n) {}\n\
                   #else\n extern \"C\" __global__ void k(float* x, const double* y, int n) {}\n\
                   #endif";
        assert_eq!(
            kinds(src),
            vec![
                pointer(true, Elem::Plain(Plain::Float(4))),
                pointer(true, Elem::Unknown),
                Kind::Value(Elem::Plain(Plain::Int(4))),
            ]
        );
        assert_eq!(
            kinds(
                "extern \"C\" __global__ void k(const float* x, int n);\n\
                 extern \"C\" __global__ void k(const float* x, float* n) {}"
            ),
            vec![
                pointer(false, Elem::Plain(Plain::Float(4))),
                Kind::Disputed { read_only: false },
            ]
        );
        assert_eq!(
            kinds(
                "extern \"C\" __global__ void k(const float* x, int n);\n\
                 extern \"C\" __global__ void k(const float* x, float* y, int n) {}"
            ),
            vec![
                Kind::Disputed { read_only: true },
                Kind::Disputed { read_only: false },
                Kind::Disputed { read_only: false },
            ]
        );
        assert_eq!(
            kinds(
                "#define F(t) t\nextern \"C\" __global__ void k(F(const float)* x) {}\n\
                 extern \"C\" __global__ void k(const float* x);"
            ),
            vec![Kind::Disputed { read_only: false }]
        );
        assert_eq!(
            kinds("extern \"C\" __global__ void k(\n#if A\nconst\n#endif\nfloat* x) {}"),
            vec![Kind::Disputed { read_only: false }]
        );
    }
}
