//! The parameters a kernel's CUDA C source declares, and the check of a launch's arguments
//! against them.
//!
//! The signature of `extern "C" __global__ void NAME(...)` is read from the source once per
//! kernel. For each parameter it gives whether it is a pointer, whether the elements it points
//! to are `const`, and its element type where it can tell: one of CUDA C's plain types
//! (`float`, `double`, `__half`, `__nv_bfloat16`, the integer types and their `<stdint.h>`
//! names), or a type known by its size (CUDA's vector types, `float4`: 16 bytes, and
//! `<cuComplex.h>`'s names for two of them, `cuFloatComplex`: 8 bytes; the pointers
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
//! A launch is then refused with [`DeviceError::InvalidArgument`](crate::DeviceError::InvalidArgument) naming the parameter when it
//! passes a different number of arguments, a buffer where a value is declared (or the
//! reverse), an input buffer for a pointer to elements that are not `const` (the kernel may
//! write through it, while an input is ordered as a read, concurrent with other readers), a
//! buffer of another element type, or a scalar of another size or kind (an `f32` where the
//! source says `double`). Integers of the same size but another signedness are accepted; an
//! element or value type the check does not know by name (a user's `Pod` struct) is accepted
//! for a plain C type of the same size only, and any type of the right size for a type known
//! by its size. Types the reader does not know (templates, structs, types from headers) are
//! checked by kind (pointer or value) and, for pointers, by `const`-ness; a source in which no
//! declaration of the kernel is found (a macro declares it) is not checked here. Where this
//! check leaves the number of parameters or a by-value parameter's size unknown
//! ([`SourceLayout`]), the CUDA backend checks them against the driver's account of the
//! compiled function, and refuses the launch where the driver cannot give one.
//!
//! A struct the source defines with fields of one plain type only (`struct Vec3 { float x,
//! y, z; };`, `typedef struct { double re, im; } complex_t;`) has no padding, so its size is
//! known, and a pointer to it is checked as [`Elem::Storage`] of that size; other structs
//! (mixed fields, a base, an alignment attribute, member functions) stay checked by kind.
//!
//! Type aliases the source declares (`typedef double real;`, `using index_t = unsigned;`,
//! `typedef const float* cfptr;`) are resolved to the types they name, through one another,
//! with C's meaning for a qualifier on a pointer alias (`const fptr x` is `float* const x`);
//! the type an alias reaches is then checked by its size, since an alias often names the
//! storage of another type (`typedef unsigned short f16_bits;` for halves): a value must be
//! of that size, and a buffer's elements a whole multiple of it, so that a kernel indexing
//! below the buffer's element count stays inside it ([`Elem::Storage`]); an alias of a
//! struct is checked as the struct. A parameter naming an alias the reader
//! cannot resolve to one type (declared with other types in the branches of an `#if`, an
//! alias template, an array, function or reference type) is [`Kind::Unresolved`]: every
//! launch is refused, since not even pointer-vs-value is known. So is a parameter whose type
//! name the source does not declare, where a function-like macro declares aliases
//! (`#define DECLARE(T, N) typedef T N##_t;`): the names its uses declare, and what they
//! stand for, are the preprocessor's.
//!
//! The check runs on both backends, so that the host backend refuses what CUDA would
//! misread.

use std::any::TypeId;

mod alias;
mod check;
mod layout;
mod text;

use alias::{storage_size, Aliases};
pub(crate) use check::check;
pub(crate) use layout::SourceLayout;
use text::{find_ident, matching_paren, parse_param, split_top_level, strip_comments, Macros};

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
    /// Elements of this many bytes named through a type alias: a buffer whose elements are
    /// a whole multiple of it is accepted (an alias often names the storage of another type,
    /// `typedef unsigned short f16_bits;`, or scratch space carved from a buffer of wider
    /// elements), so that a kernel indexing below the buffer's element count stays inside
    /// it, and every element it reads is aligned.
    Storage(u8),
    /// A type the check does not know (a template, a struct, a type from a header).
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
            if let Some(bytes) = storage_size(word) {
                return Elem::Storage(bytes);
            }
            vector_size(word).map_or(Elem::Unknown, Elem::Sized)
        } else {
            Elem::Unknown
        }
    }
}

/// The size of CUDA's built-in vector type `word` (`float4`, `uchar2`, `__half2`, `dim3`), or
/// of a header's name for one (`cuFloatComplex`).
fn vector_size(word: &str) -> Option<u8> {
    match word {
        "__half2" | "half2" | "__nv_bfloat162" | "nv_bfloat162" => return Some(4),
        // `<cuComplex.h>`'s names for `float2` and `double2`.
        "cuFloatComplex" | "cuComplex" => return Some(8),
        "cuDoubleComplex" => return Some(16),
        "dim3" => return Some(12),
        _ => {}
    }
    // At the last character, which need not be one byte (identifiers may hold any).
    let (last, _) = word.char_indices().next_back()?;
    let (base, lanes) = word.split_at(last);
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
    /// The parameter names a type alias the check cannot resolve (declared with other types
    /// in the branches of an `#if`, an alias template, an array or function type): nothing
    /// is known of it, not even whether it is a pointer, and every argument is refused. The
    /// alias is named by [`Param::unresolved`].
    Unresolved,
}

/// One declared parameter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Param {
    /// The declaration as written, for messages.
    pub(crate) text: String,
    pub(crate) kind: Kind,
    /// The type alias that makes the parameter [`Kind::Unresolved`], for messages.
    pub(crate) unresolved: Option<String>,
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
    let aliases = Aliases::of(&source, &macros);
    let heads: Vec<Option<Vec<Param>>> = parameter_lists(&source, name)
        .into_iter()
        .map(|list| read_list(list?, &macros, &aliases))
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
fn read_list(list: &str, macros: &Macros<'_>, aliases: &Aliases) -> Option<Vec<Param>> {
    if list.contains('#') {
        return None;
    }
    let list = macros.expand(list)?;
    let list = list.trim();
    if list.is_empty() || list == "void" {
        return Some(Vec::new());
    }
    split_top_level(list)
        .map(|p| {
            let p = p.trim();
            if p.is_empty() {
                return None;
            }
            let shown = p.split_whitespace().collect::<Vec<_>>().join(" ");
            match aliases.resolve(p) {
                Ok(resolved) if resolved == p => parse_param(p).map(|param| Param {
                    text: shown,
                    ..param
                }),
                // Through an alias, elements are checked by size: an alias often names the
                // storage of another type (`typedef unsigned short f16_bits;` for halves).
                Ok(resolved) => parse_param(resolved.trim()).map(|param| Param {
                    text: shown,
                    kind: by_size(param.kind),
                    ..param
                }),
                Err(alias) => Some(Param {
                    text: shown,
                    kind: Kind::Unresolved,
                    unresolved: Some(alias),
                }),
            }
        })
        .collect()
}

/// `kind`, read through a type alias: a value by its size, the elements of a pointer as
/// [`Elem::Storage`].
fn by_size(kind: Kind) -> Kind {
    match kind {
        Kind::Value(Elem::Plain(p)) => Kind::Value(Elem::Sized(p.size() as u8)),
        Kind::Value(Elem::Storage(bytes)) => Kind::Value(Elem::Sized(bytes)),
        Kind::Pointer {
            writable,
            elem: Elem::Plain(p),
        } => Kind::Pointer {
            writable,
            // At most 8: the sizes of the plain types.
            elem: Elem::Storage(p.size() as u8),
        },
        Kind::Pointer {
            writable,
            elem: Elem::Sized(bytes),
        } => Kind::Pointer {
            writable,
            elem: Elem::Storage(bytes),
        },
        other => other,
    }
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
                unresolved: None,
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
        let unresolved = at.iter().flatten().find_map(|p| p.unresolved.clone());
        if unresolved.is_some() {
            return Param {
                text,
                kind: Kind::Unresolved,
                unresolved,
            };
        }
        let kinds: Vec<Kind> = at.iter().flatten().map(|p| p.kind).collect();
        let kind = match kinds.split_first() {
            Some((first, rest)) if counts_agree => rest
                .iter()
                .try_fold(*first, |a, b| merge_kind(a, *b))
                .unwrap_or(Kind::Disputed { read_only }),
            _ => Kind::Disputed { read_only },
        };
        Param {
            text,
            kind,
            unresolved: None,
        }
    });
    let mut merged: Vec<Param> = merged.collect();
    if merged.is_empty() && !counts_agree {
        merged.push(Param {
            text: "(declarations that disagree)".into(),
            kind: UNDECLARED,
            unresolved: None,
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
    fn aliases_resolve_with_c_qualifier_rules() {
        let src = "typedef float* fptr;\n#define REAL double\ntypedef REAL real;\n\
                   typedef struct P P;\nusing namespace cuda;\nusing cfptr = const float*;\n\
                   extern \"C\" __global__ void k(const fptr a, const fptr* b, fptr const* c, \
                   cfptr d, real e, P* f, double real, struct P g) {}";
        assert_eq!(
            kinds(src),
            vec![
                pointer(true, Elem::Storage(4)),
                pointer(false, Elem::Storage(8)),
                pointer(false, Elem::Storage(8)),
                pointer(false, Elem::Storage(4)),
                Kind::Value(Elem::Sized(8)),
                pointer(true, Elem::Unknown),
                Kind::Value(Elem::Plain(Plain::Float(8))),
                Kind::Value(Elem::Unknown),
            ]
        );
        let src = "template <class T, class U> struct Two;\ntypedef double T;\n\
                   extern \"C\" __global__ void k(T* x) {}";
        assert_eq!(kinds(src), vec![pointer(true, Elem::Storage(8))]);
        let src = "typedef float real;\ntypedef double real;\ntypedef a b;\ntypedef b a;\n\
                   extern \"C\" __global__ void k(real* x, const a* y);\n\
                   extern \"C\" __global__ void k(float* x, const float* y) {}";
        let params = parse(src, "k").expect("a signature");
        assert_eq!(
            params
                .iter()
                .map(|p| (p.kind, p.unresolved.as_deref()))
                .collect::<Vec<_>>(),
            vec![
                (Kind::Unresolved, Some("real")),
                (Kind::Unresolved, Some("a"))
            ]
        );
    }

    #[test]
    fn structs_of_one_plain_type_are_known_by_size() {
        let src = "struct P;\nstruct P { float x, y, z; };\ntypedef struct P P;\n\
                   struct __align__(16) A { float x, y, z; };\nstruct B : P { float w; };\n\
                   struct M { float a; double b; };\nstruct V { double v[2][2]; };\n\
                   typedef struct { short lo, hi; } S;\nstruct F { float x; int f(); };\n\
                   extern \"C\" __global__ void k(P* p, A* a, B* b, M* m, const V* v, S s, \
                   F* f) {}";
        assert_eq!(
            kinds(src),
            vec![
                pointer(true, Elem::Storage(12)),
                pointer(true, Elem::Unknown),
                pointer(true, Elem::Unknown),
                pointer(true, Elem::Unknown),
                pointer(false, Elem::Storage(32)),
                Kind::Value(Elem::Sized(4)),
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
