//! Kernel sources the reader of CUDA C signatures has never seen: whatever the source (valid
//! sources cut, spliced and sprinkled with brackets, comments, quotes, directives and
//! multibyte characters; deep nesting; a megabyte of text; macros and aliases that grow without
//! bound), a launch returns `Ok` or [`DeviceError::InvalidArgument`] naming the kernel and an
//! argument, without panicking and without hanging.
//!
//! The reader runs before any backend, so these tests launch on `Device::host()` whatever the
//! device under test is (on CUDA, every source would be compiled), with host implementations
//! that do nothing. Cases are drawn from fixed seeds, and a failure prints the source and the
//! arguments. `CUFLOW_RANDOM_SOURCES=N` runs N times as many cases.

mod kernel_source;

use std::fmt::Write as _;
use std::panic::{catch_unwind, AssertUnwindSafe};

use cuflow_runtime::{Device, DeviceError};
use cuflow_testing::rng::{scale_from_env, seeded_rng};
use rand::rngs::StdRng;
use rand::Rng;

use kernel_source::signatures::signature_source;
use kernel_source::*;

// ---------------------------------------------------------------------------------------------
// Mutated sources never panic.

/// Realistic sources covering what the reader reads, each with the name of its kernel.
const CORPUS: &[(&str, &str)] = &[
    (
        "k",
        r#"extern "C" __global__ void k(float* x, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1.0f;
}"#,
    ),
    (
        "ordinary",
        r#"#include <cuda_fp16.h>
#include <cuda_bf16.h>
#define RESTRICT __restrict__
extern "C" __global__ void ordinary(const float* RESTRICT, float* const,
    const __half*, __nv_bfloat16*, unsigned long long);
extern "C" __global__ void __launch_bounds__(256)
ordinary(const float* __restrict__ x, float* const y, const __half* h,
         __nv_bfloat16* b, unsigned long long n) {
    unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { y[i] = x[i] + __half2float(h[i]); b[i] = __float2bfloat16(y[i]); }
}"#,
    ),
    (
        "pp",
        r#"extern "C" __global__ void pp(const float** p, float* const* q, const float* const r[],
    float* s[], int t[][4], unsigned n) {
    if (threadIdx.x < n) p[threadIdx.x] = nullptr; }"#,
    ),
    (
        "alias",
        r#"typedef double real;
using index_t = unsigned long long;
typedef const float cfloat;
typedef real scalar_t;
typedef float* fptr;
typedef const float* cfptr;
using vptr = volatile int*;
extern "C" __global__ void alias(scalar_t* x, cfloat* y, index_t n, fptr a, cfptr b,
    const fptr c, fptr const* d, vptr v) {
    if (threadIdx.x < n) x[threadIdx.x] = y[threadIdx.x]; }"#,
    ),
    (
        "structs",
        r#"struct Vec3 { float x, y, z; };
typedef struct { double re; double im; } complex_t;
struct Mixed { float a; double b; };
struct __align__(16) Aligned { float v[4]; };
typedef struct P P;
struct P { short lo, hi; };
extern "C" __global__ void structs(Vec3* v, const complex_t* c, Mixed* m, P p, Aligned* a,
    unsigned n) {
    if (threadIdx.x < n) { v[threadIdx.x].x = (float)c[threadIdx.x].re; m[threadIdx.x].a = 0; } }"#,
    ),
    (
        "tpl",
        r#"template <typename A, typename B> struct Pair { A a; B b; };
template <typename T> __device__ T twice(T x) { return x + x; }
template <typename T> using ptr = T*;
extern "C" __global__ void tpl(Pair< const int, float >* out, Pair<int, Pair<float, double>> v,
    unsigned n) {
    if (threadIdx.x < n) out[threadIdx.x].b = twice(1.0f); }"#,
    ),
    (
        "pre",
        r#"#if 0
extern "C" __global__ void pre(const float* x, unsigned n) { }
#elif defined(CUFLOW_NEVER_DEFINED)
extern "C" __global__ void pre(const float* x, const float* y, unsigned n) { }
#else
extern "C" __global__ void pre(float* x, unsigned n) {
    if (threadIdx.x < n) x[threadIdx.x] = 0.0f; }
#endif"#,
    ),
    (
        "macros",
        r#"#define IN const float* __restrict__
#define REAL double
#define N_THREADS 256
#define IDX(i) ((i) * 2)
#define DECLARE(T, NAME) typedef T NAME##_t;
DECLARE(double, real)
#define LONG_ONE \
    unsigned \
    long long
extern "C" __global__ void __launch_bounds__(N_THREADS) macros(IN x, REAL* y, LONG_ONE n) {
    if (threadIdx.x < n) y[IDX(threadIdx.x) / 2] = x[threadIdx.x]; }"#,
    ),
    (
        "inner",
        "extern \"C\" __global__ void inner(\n#if 0\nconst\n#endif\nfloat* x, unsigned n) {\n\
         if (threadIdx.x < n) x[threadIdx.x] = 0.0f; }",
    ),
    (
        "comments",
        r#"// a comment with __global__ void comments(int) in it
/* extern "C" __global__ void comments(double* wrong); */
__device__ void say() { printf("comments(%d) /* not a comment\n", 1); }
__device__ const char* url() { return "http://example.com/comments("; }
__device__ char quote() { return '"'; }
extern "C" /* block */ __global__ void // line
comments( /* x */ const float* /* y */ x, // n next
    unsigned /**/ n) { }"#,
    ),
    (
        "vec",
        r#"#include <cuComplex.h>
extern "C" __global__ void vec(float4* v, const double2* w, const short2* h, __half2* p,
    cuFloatComplex* c, const cuDoubleComplex* d, dim3 shape, float3 f, unsigned n) { }"#,
    ),
    (
        "arr_product",
        r#"extern "C" __global__ void arr_product(const float x[2*2], float* y, bool flag,
    unsigned short, signed, long int m, __grid_constant__ const float4 g) {
    if (threadIdx.x < 4) y[threadIdx.x] = x[threadIdx.x]; }"#,
    ),
    (
        "unicode_type",
        "struct Pointé { float x; float y; };\n\
         extern \"C\" __global__ void unicode_type(Pointé p, float* données) { données[0] = p.x; }",
    ),
    (
        "k",
        r#"extern "C" {
__global__ void k(void);
__global__ void k() { }
}"#,
    ),
];

/// Tokens inserted into sources: brackets, operators, comment and literal openers, line
/// splices, directives, keywords, and characters of one to four bytes.
const TOKENS: &[&str] = &[
    "(",
    ")",
    "<",
    ">",
    "[",
    "]",
    "{",
    "}",
    ",",
    "*",
    "&",
    "::",
    "=",
    ";",
    "...",
    "#",
    "const",
    "/*",
    "*/",
    "//",
    "\"",
    "'",
    "R\"(",
    ")\"",
    "u8'",
    "1'000",
    "\\\n",
    "\\",
    "\n",
    "\r\n",
    "#if 0\n",
    "#else\n",
    "#endif\n",
    "#define X ",
    "#define F(a) a\n",
    "#undef X\n",
    "typedef ",
    "using X = ",
    "struct {",
    "struct S { float a, b; };",
    "[[",
    "]]",
    "__attribute__((",
    "R\"x(",
    ")x\"",
    "typedef struct ",
    "__global__",
    "extern \"C\" ",
    "void",
    "k",
    "k(",
    "unsigned",
    "float",
    "double",
    "__half",
    "float4",
    "é",
    "€",
    "😀",
    "\u{0}",
    "\u{a0}",
];

/// Names launched besides the corpus's own: none, not identifiers, keywords.
const ODD_NAMES: &[&str] = &[
    "",
    " ",
    "k k",
    "k(",
    "é",
    "void",
    "__global__",
    "const",
    "K",
];

/// A byte offset of `s` at a character boundary, at random.
fn boundary(rng: &mut StdRng, s: &str) -> usize {
    let mut i = rng.gen_range(0..=s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// A range of `s` between character boundaries, at most `max` bytes long.
fn span(rng: &mut StdRng, s: &str, max: usize) -> std::ops::Range<usize> {
    let start = boundary(rng, s);
    let mut end = (start + rng.gen_range(0..=max)).min(s.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    start..end
}

/// `source` after one to five random edits: ranges deleted, replaced, duplicated; tokens
/// inserted, once or repeated.
fn mutate(rng: &mut StdRng, source: &str) -> String {
    let mut s = source.to_string();
    for _ in 0..rng.gen_range(1..=5) {
        let token = TOKENS[rng.gen_range(0..TOKENS.len())];
        match rng.gen_range(0..6) {
            0 => {
                let r = span(rng, &s, 24);
                s.replace_range(r, "");
            }
            1 => {
                let r = span(rng, &s, 8);
                s.replace_range(r, token);
            }
            2 => {
                let r = span(rng, &s, 64);
                let copy = s[r].to_string();
                let at = boundary(rng, &s);
                s.insert_str(at, &copy);
            }
            3 => {
                let repeated = token.repeat(rng.gen_range(2..200));
                let at = boundary(rng, &s);
                s.insert_str(at, &repeated);
            }
            _ => {
                let at = boundary(rng, &s);
                s.insert_str(at, token);
            }
        }
    }
    s
}

#[test]
fn mutated_sources_give_a_documented_outcome() {
    naming_a_hang(|current| {
        let s = Device::host().new_stream().expect("a host stream");
        let cases = 500 * scale_from_env("CUFLOW_RANDOM_SOURCES");
        for case in 0..cases {
            let seed = 0x5eed_c0de_0000 ^ case as u64;
            let mut rng = seeded_rng(seed);
            // A source of the corpus, or a generated one.
            let (name, original) = if rng.gen() {
                let (name, source) = CORPUS[rng.gen_range(0..CORPUS.len())];
                (name, source.to_string())
            } else {
                ("k", signature_source(&mut rng, "k").0)
            };
            let source = mutate(&mut rng, &original);
            let name = if rng.gen_ratio(1, 16) {
                ODD_NAMES[rng.gen_range(0..ODD_NAMES.len())]
            } else {
                name
            };
            let specs: Vec<ArgSpec> = (0..rng.gen_range(0..=9))
                .map(|_| ArgSpec::random(&mut rng))
                .collect();
            let what = format!("case {case} (seed {seed:#x})");
            at_case(current, &what, name, &source);
            let outcome = launch_unwinding(&what, name, &source, &specs, &s);
            assert_documented(&what, name, &source, &specs, &outcome);
            // A second kernel of the same text is checked the same: the reader depends on
            // nothing but the text.
            let again = launch_unwinding(&what, name, &source, &specs, &s);
            assert_eq!(
                format!("{outcome:?}"),
                format!("{again:?}"),
                "{what}: two kernels of one source were checked differently\nkernel {name:?}, \
                 arguments {specs:?}\nsource:\n{}",
                shown(&source)
            );
        }
    });
}

#[test]
fn every_cut_of_a_valid_source_gives_a_documented_outcome() {
    naming_a_hang(|current| {
        let s = Device::host().new_stream().expect("a host stream");
        let mut rng = seeded_rng(0xc07);
        for (name, source) in CORPUS {
            let specs: Vec<ArgSpec> = (0..rng.gen_range(0..=6))
                .map(|_| ArgSpec::random(&mut rng))
                .collect();
            for at in (0..=source.len()).filter(|&i| source.is_char_boundary(i)) {
                for (piece, kept) in [(&source[..at], "before"), (&source[at..], "from")] {
                    let what = format!("{name} cut at byte {at}, the part {kept} it");
                    at_case(current, &what, name, piece);
                    let outcome = launch_unwinding(&what, name, piece, &specs, &s);
                    assert_documented(&what, name, piece, &specs, &outcome);
                }
            }
        }
    });
}

/// A source the reader's scans could take long over, or overflow on, with the kernel `deep(float*
/// x, unsigned n)` in it.
struct Pathological {
    what: String,
    source: String,
    /// The text before the kernel hides it: a comment or a raw string that does not close.
    hides_kernel: bool,
}

impl Pathological {
    fn new(what: impl Into<String>, source: String) -> Pathological {
        Pathological {
            what: what.into(),
            source,
            hides_kernel: false,
        }
    }
}

/// Deep nesting, long runs of the words and characters the reader looks for, macros and aliases
/// whose text grows tenfold at every level.
fn pathological_sources() -> Vec<Pathological> {
    const DEEP: usize = 10_000;
    const MEGABYTE: usize = 1 << 20;
    let kernel = "extern \"C\" __global__ void deep(float* x, unsigned n) { }\n";
    let mut sources = Vec::new();
    for (open, close) in [("(", ")"), ("<", ">"), ("[", "]"), ("{", "}"), ("/*", "*/")] {
        let nested = format!("{}float* x{}", open.repeat(DEEP), close.repeat(DEEP));
        sources.push(Pathological::new(
            format!("{DEEP} nested {open}{close} in a parameter list"),
            format!("extern \"C\" __global__ void deep({nested}, unsigned n) {{ }}"),
        ));
        sources.push(Pathological {
            hides_kernel: open == "/*",
            ..Pathological::new(
                format!("{DEEP} unclosed {open} before a kernel"),
                format!("{}\n{kernel}", open.repeat(DEEP)),
            )
        });
        sources.push(Pathological::new(
            format!("{DEEP} unopened {close} before a kernel"),
            format!("{}\n{kernel}", close.repeat(DEEP)),
        ));
    }
    sources.push(Pathological::new(
        format!("{DEEP} nested template arguments"),
        format!(
            "extern \"C\" __global__ void deep({}float{}* x, unsigned n) {{ }}",
            "Box<".repeat(DEEP),
            ">".repeat(DEEP)
        ),
    ));
    // A run of each word or character the reader scans for, the kernel after it: a megabyte
    // of those that start declarations, a quarter of one of the others.
    let runs = [
        ("__global__ ", MEGABYTE),
        ("__global__ void deep(", MEGABYTE),
        ("typedef ", MEGABYTE),
        ("using ", MEGABYTE),
        ("struct S { ", MEGABYTE),
        ("#define F(x) x\n", MEGABYTE),
        (
            "extern \"C\" __global__ void deep(float* x);\n",
            MEGABYTE / 4,
        ),
        ("typedef struct {", MEGABYTE / 4),
        ("using X = ", MEGABYTE / 4),
        ("struct ", MEGABYTE / 4),
        ("enum class ", MEGABYTE / 4),
        ("#define A B\n", MEGABYTE / 4),
        ("#define L \\\n", MEGABYTE / 4),
        ("#undef A\n", MEGABYTE / 4),
        ("(", MEGABYTE / 4),
        ("{", MEGABYTE / 4),
        ("<", MEGABYTE / 4),
        (",", MEGABYTE / 4),
        ("*", MEGABYTE / 4),
        ("/*", MEGABYTE / 4),
        ("//", MEGABYTE / 4),
        ("\"", MEGABYTE / 4),
        ("'", MEGABYTE / 4),
        ("\\\n", MEGABYTE / 4),
        ("deep(", MEGABYTE / 4),
        ("é", MEGABYTE / 4),
        ("R\"", MEGABYTE / 4),
        ("R\"x(", MEGABYTE / 4),
        ("u8'", MEGABYTE / 4),
        ("[[", MEGABYTE / 4),
        ("__attribute__((", MEGABYTE / 4),
    ];
    for (run, bytes) in runs {
        sources.push(Pathological {
            hides_kernel: run == "/*" || run == "R\"x(",
            ..Pathological::new(
                format!("{} KiB of {run:?}", bytes >> 10),
                format!("{}\n{kernel}", run.repeat(bytes / run.len())),
            )
        });
    }
    // A megabyte of realistic sources, the kernel at its end.
    let realistic: String = CORPUS.iter().map(|(_, s)| format!("{s}\n")).collect();
    sources.push(Pathological::new(
        "a megabyte of kernels".to_string(),
        format!("{}\n{kernel}", realistic.repeat(MEGABYTE / realistic.len())),
    ));
    // Macros and aliases whose text grows tenfold at each level.
    let ten = |name: &str| [name; 10].join(" ");
    sources.push(Pathological::new(
        "a macro naming itself ten times".to_string(),
        format!(
            "#define X {}\ntypedef X t;\nextern \"C\" __global__ void deep(X* x, unsigned n) {{ }}",
            ten("X")
        ),
    ));
    let mut chain = String::from("#define M0 float\n");
    let mut aliases = String::from("typedef float A0;\n");
    for level in 1..=40 {
        let _ = writeln!(
            chain,
            "#define M{level} {}",
            ten(&format!("M{}", level - 1))
        );
        let _ = writeln!(
            aliases,
            "typedef Pair<{}> A{level};",
            vec![format!("A{}", level - 1); 10].join(", ")
        );
    }
    sources.push(Pathological::new(
        "macros of forty levels, each ten of the one before".to_string(),
        format!(
            "{chain}typedef M40 t;\nextern \"C\" __global__ void deep(M40* x, unsigned n) {{ }}"
        ),
    ));
    sources.push(Pathological::new(
        "aliases of forty levels, each ten of the one before".to_string(),
        format!("{aliases}extern \"C\" __global__ void deep(A40* x, unsigned n) {{ }}"),
    ));
    sources.push(Pathological::new(
        "256 KiB of aliases of a macro naming itself ten times".to_string(),
        format!(
            "#define X {}\n{}{kernel}",
            ten("X"),
            "typedef X t;\n".repeat(MEGABYTE / 4 / 13)
        ),
    ));
    sources.push(Pathological::new(
        "a parameter of fifty thousand attributes".to_string(),
        format!(
            "extern \"C\" __global__ void deep({}float* x, unsigned n) {{ }}",
            "[[maybe_unused]] __attribute__((unused)) ".repeat(50_000)
        ),
    ));
    sources.push(Pathological::new(
        "declarations of one parameter, and one of a hundred thousand".to_string(),
        format!(
            "{}extern \"C\" __global__ void deep({}int);\n{kernel}",
            "__global__ void deep(int);\n".repeat(20_000),
            "int, ".repeat(100_000)
        ),
    ));
    sources.push(Pathological::new(
        "an alias naming itself ten times".to_string(),
        format!(
            "typedef {} a;\ntypedef {} b;\nextern \"C\" __global__ void deep(a* x, unsigned n) {{ }}",
            ten("b"),
            ten("a")
        ),
    ));
    sources
}

/// Each pathological source is read within the hang limit: in well under a second in a debug
/// build where the reader takes time in proportion to the text, in minutes or never where it
/// reads a character once for each of those before it, or expands text without bound.
#[test]
fn pathological_sources_are_read_without_hanging() {
    naming_a_hang(|current| {
        let s = Device::host().new_stream().expect("a host stream");
        let output = [
            ArgSpec::Buffer {
                ty: RustTy::F32,
                len: 3,
                writable: true,
            },
            ArgSpec::Scalar(RustTy::U32),
        ];
        let input = [
            ArgSpec::Buffer {
                ty: RustTy::F32,
                len: 3,
                writable: false,
            },
            output[1],
        ];
        for p in pathological_sources() {
            let (what, source) = (&p.what, &p.source);
            at_case(current, what, "deep", source);
            // The source is read at the first launch of a kernel, once.
            let kernel = noop("deep", source);
            let (outcome, with_input) = catch_unwind(AssertUnwindSafe(|| {
                let outcome = launch(&kernel, &s, &output);
                (outcome, launch(&kernel, &s, &input))
            }))
            .unwrap_or_else(|_| panic!("{what}: the launch panicked\nsource:\n{}", shown(source)));
            assert_documented(what, "deep", source, &output, &outcome);
            // The kernel after the text is read: its `float* x` takes no input.
            match with_input {
                Err(DeviceError::InvalidArgument { index: 0, .. }) => {}
                Ok(()) if p.hides_kernel => {}
                other => panic!(
                    "{what}: an input for `float* x` gave {other:?}\nsource:\n{}",
                    shown(source)
                ),
            }
        }
    });
}
