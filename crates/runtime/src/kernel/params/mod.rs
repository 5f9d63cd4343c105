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
//! The text is read as the compiler reads it before it looks at declarations: lines a
//! backslash continues are joined, and comments and the contents of string and character
//! literals are passed over (`printf("k(int) /* %d\n", n)` declares nothing and opens no
//! comment). Identifiers may hold characters outside ASCII (`ék` is not `k`), and attributes
//! (`[[maybe_unused]]`, `__attribute__((unused))`) say nothing of a parameter's type. The
//! reader takes time in proportion to the source: macros and aliases whose text grows without
//! bound (a macro that names itself twice) leave the parameters that name them unreadable or
//! unresolved rather than be expanded further.
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
use text::{
    find_ident, is_ident_char, matching_paren, parse_param, split_top_level,
    strip_comments_and_literals, without_attributes, Macros,
};

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
    Sized(u32),
    /// Elements of this many bytes named through a type alias: a buffer whose elements are
    /// a whole multiple of it is accepted (an alias often names the storage of another type,
    /// `typedef unsigned short f16_bits;`, or scratch space carved from a buffer of wider
    /// elements), so that a kernel indexing below the buffer's element count stays inside
    /// it, and every element it reads is aligned.
    Storage(u32),
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
            vector_size(word).map_or(Elem::Unknown, |bytes| Elem::Sized(bytes.into()))
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
    /// in the branches of an `#if`, an alias template, an array or function type, aliases
    /// that name one another without end): nothing is known of it, not even whether it is a
    /// pointer, and every argument is refused. The alias is named by [`Param::unresolved`].
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
/// declaration of it is found (none is, of a name that is not an identifier).
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
    let source = strip_comments_and_literals(source);
    let macros = Macros::of(&source);
    let aliases = Aliases::of(&source, &macros);
    let heads: Vec<Option<Vec<Param>>> = parameter_lists(&source, name)
        .into_iter()
        .map(|list| read_list(list?, &macros, &aliases))
        .collect();
    merge(heads)
}

/// The parameter list of every `__global__` declaration of `name` (`None`: one whose list
/// does not close). A name that is not an identifier (`""`, `"k(int)"`) is declared by none.
fn parameter_lists<'s>(source: &'s str, name: &str) -> Vec<Option<&'s str>> {
    const GLOBAL: &str = "__global__";
    let identifier =
        name.chars().next().is_some_and(|c| !c.is_ascii_digit()) && name.chars().all(is_ident_char);
    if !identifier {
        return Vec::new();
    }
    let globals: Vec<usize> = source.match_indices(GLOBAL).map(|(at, _)| at).collect();
    let mut lists = Vec::new();
    for (i, &at) in globals.iter().enumerate() {
        let start = at + GLOBAL.len();
        // `__global__ [__launch_bounds__(..)] void NAME (...)`, ended by its body's `{` or
        // a prototype's `;`, and by the next `__global__` at the latest: no character is
        // read for two heads.
        let limit = globals.get(i + 1).copied().unwrap_or(source.len());
        let head_end = source[start..limit]
            .find(['{', ';'])
            .map_or(limit, |end| start + end);
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
            let p = without_attributes(p);
            let p = p.trim();
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
        // At most 8: the sizes of the plain types.
        Kind::Value(Elem::Plain(p)) => Kind::Value(Elem::Sized(p.size() as u32)),
        Kind::Value(Elem::Storage(bytes)) => Kind::Value(Elem::Sized(bytes)),
        Kind::Pointer {
            writable,
            elem: Elem::Plain(p),
        } => Kind::Pointer {
            writable,
            elem: Elem::Storage(p.size() as u32),
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

/// Merges the declarations of one kernel (see [`parse`]), visiting each declared parameter
/// once.
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
    let reached_by_all = read.iter().map(Vec::len).min().unwrap_or(0);
    let counts_agree = reached_by_all == count && unreadable.is_none();
    // At each position, over the declarations that reach it: the text of the last, the alias
    // the first leaves unresolved, whether all make it a pointer to const elements, and the
    // kind they agree on (`Some(None)`: they disagree).
    let mut texts: Vec<&str> = vec![""; count];
    let mut unresolved: Vec<Option<&str>> = vec![None; count];
    let mut all_const: Vec<bool> = vec![true; count];
    let mut kinds: Vec<Option<Option<Kind>>> = vec![None; count];
    for params in &read {
        for (i, p) in params.iter().enumerate() {
            texts[i] = &p.text;
            unresolved[i] = unresolved[i].or(p.unresolved.as_deref());
            all_const[i] &= matches!(
                p.kind,
                Kind::Pointer {
                    writable: false,
                    ..
                }
            );
            kinds[i] = Some(match kinds[i] {
                None => Some(p.kind),
                Some(merged) => merged.and_then(|k| merge_kind(k, p.kind)),
            });
        }
    }
    let mut merged: Vec<Param> = (0..count)
        .map(|i| {
            let text = texts[i].to_string();
            if let Some(alias) = unresolved[i] {
                return Param {
                    text,
                    kind: Kind::Unresolved,
                    unresolved: Some(alias.to_string()),
                };
            }
            let read_only = unreadable.is_none() && i < reached_by_all && all_const[i];
            let disputed = Kind::Disputed { read_only };
            let kind = match kinds[i] {
                Some(Some(kind)) if counts_agree => kind,
                _ => disputed,
            };
            Param {
                text,
                kind,
                unresolved: None,
            }
        })
        .collect();
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

    const FLOAT: Elem = Elem::Plain(Plain::Float(4));
    const INT: Elem = Elem::Plain(Plain::Int(4));

    #[test]
    fn literals_and_comments_declare_nothing_and_hide_nothing() {
        // A comment opener and declarations inside literals, a quote in a character literal,
        // digit separators.
        let src = "__device__ void say() { printf(\"k(int) /* %d\\n\", 1); }\n\
                   __device__ const char* s() { return \"__global__ void k(int);\"; }\n\
                   __device__ char q() { return '\"'; }\n\
                   __device__ const char* r() { return R\"x(__global__ void k(int); )\")x\"; }\n\
                   __device__ int n() { return 1'000 + u8'a'; }\n\
                   extern \"C\" __global__ void k(const float* x, unsigned n) {}";
        assert_eq!(kinds(src), vec![pointer(false, FLOAT), Kind::Value(INT)]);
        // A string not closed on its line ends there.
        let src = "#error \"unclosed\n// don't\nextern \"C\" __global__ void k(float* x) {}";
        assert_eq!(kinds(src), vec![pointer(true, FLOAT)]);
    }

    #[test]
    fn a_backslash_at_the_end_of_a_line_joins_it_to_the_next() {
        let src = "extern \"C\" __glo\\\nbal__ void k(const\\\r\n float* x) {}";
        assert_eq!(kinds(src), vec![pointer(false, FLOAT)]);
        // A line comment continued onto the next line hides it.
        let src = "// a comment \\\nextern \"C\" __global__ void k(double* x) {}\n\
                   extern \"C\" __global__ void k(const float* x) {}";
        assert_eq!(kinds(src), vec![pointer(false, FLOAT)]);
    }

    #[test]
    fn characters_outside_ascii_belong_to_names() {
        // `ék` and `kë` are other kernels.
        let src = "extern \"C\" __global__ void ék(double d) {}\n\
                   extern \"C\" __global__ void kë(double d) {}\n\
                   extern \"C\" __global__ void k(const float* x) {}";
        assert_eq!(kinds(src), vec![pointer(false, FLOAT)]);
        // `Té` is not the macro `T`, and `données` is a name beside a macro declaring aliases.
        let src = "#define T double\ntypedef float Té;\n\
                   #define DECLARE(A, N) typedef A N;\nDECLARE(float, real)\n\
                   extern \"C\" __global__ void k(Té* x, int données) {}";
        assert_eq!(
            kinds(src),
            vec![pointer(true, Elem::Storage(4)), Kind::Value(INT)]
        );
    }

    #[test]
    fn a_name_that_is_not_an_identifier_is_declared_by_none() {
        let src = "extern \"C\" __global__ void k(float* x) {}\n__global__ void (float* y);";
        for name in ["", " ", "k(", "k k", "1k", "*"] {
            assert_eq!(parse(src, name), None, "{name:?}");
        }
    }

    #[test]
    fn attributes_say_nothing_of_a_parameter() {
        let src = "extern \"C\" __global__ void k([[maybe_unused]] int n, \
                   const float* x __attribute__((unused)), \
                   [[gnu::unused, deprecated(\"old\")]] float* __attribute__ ((aligned(8))) y) {}";
        assert_eq!(
            kinds(src),
            vec![
                Kind::Value(INT),
                pointer(false, FLOAT),
                pointer(true, FLOAT)
            ]
        );
    }

    #[test]
    fn a_parameter_may_take_the_name_of_a_type() {
        let src = "extern \"C\" __global__ void k(float half, double float2, unsigned short, \
                   long long) {}";
        assert_eq!(
            kinds(src),
            vec![
                Kind::Value(FLOAT),
                Kind::Value(Elem::Plain(Plain::Float(8))),
                Kind::Value(Elem::Plain(Plain::Int(2))),
                Kind::Value(Elem::Plain(Plain::Int(8))),
            ]
        );
    }

    #[test]
    fn qualifiers_and_declarators_are_not_names_of_types_beside_aliases() {
        // A function pointer's name is not a type, nor is `__grid_constant__`, where a
        // function-like macro declaring aliases makes every unknown type name unresolvable.
        let src = "#define DECLARE(A, N) typedef A N;\nDECLARE(double, real)\n\
                   typedef double wide;\n\
                   extern \"C\" __global__ void k(float (*f)(int, float), \
                   __grid_constant__ const wide, wide (*g)(wide)) {}";
        assert_eq!(
            kinds(src),
            vec![
                pointer(true, Elem::Unknown),
                Kind::Value(Elem::Sized(8)),
                pointer(true, Elem::Unknown)
            ]
        );
    }

    #[test]
    fn a_struct_of_one_plain_type_is_known_by_size_past_255_bytes() {
        let src = "struct Big { float v[64]; };\ntypedef struct { double m[32][2]; } Huge;\n\
                   extern \"C\" __global__ void k(Big* b, const Huge* h) {}";
        assert_eq!(
            kinds(src),
            vec![
                pointer(true, Elem::Storage(256)),
                pointer(false, Elem::Storage(512))
            ]
        );
    }

    #[test]
    fn a_typedef_whose_braces_close_before_they_open_is_passed_over() {
        let src = "typedef struct } { x;\nextern \"C\" __global__ void k(float* x) {}";
        assert_eq!(kinds(src), vec![pointer(true, FLOAT)]);
    }

    #[test]
    fn text_that_grows_without_bound_is_left_unread() {
        let ten = |word: &str| [word; 10].join(" ");
        // A macro naming itself, in a parameter list and in an alias: unreadable.
        let src = format!(
            "#define X {}\ntypedef X t;\nextern \"C\" __global__ void k(X* x, t* y) {{}}",
            ten("X")
        );
        assert_eq!(kinds(&src), vec![Kind::Disputed { read_only: false }]);
        // Aliases each naming the one before ten times: unresolved.
        let mut src = String::from("template <class... T> struct Many;\ntypedef float A0;\n");
        for level in 1..=40 {
            let before = format!("A{}", level - 1);
            src.push_str(&format!(
                "typedef Many<{}> A{level};\n",
                vec![before; 10].join(", ")
            ));
        }
        src.push_str("extern \"C\" __global__ void k(A40* x, float* y) {}");
        let params = parse(&src, "k").expect("a signature");
        assert_eq!(params[0].kind, Kind::Unresolved);
        assert_eq!(params[1].kind, pointer(true, FLOAT));
    }
}
