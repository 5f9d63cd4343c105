//! The parameters a launch is checked against are read from the kernel's CUDA C source as the
//! compiler would read it: every declaration of the kernel (a prototype, the branches of an
//! `#if`) is trusted no further than each of them, a pointer to pointers holds writable
//! 8-byte elements, a `const` inside a template argument does not make the elements `const`,
//! and a compile option cannot change what the source declares. The checks run before any
//! backend is involved, so these tests run on the device under test; the kernels they do
//! launch write nothing.

use cuflow_runtime::{DeviceBuffer, DeviceError, Kernel, KernelArgs, LaunchConfig, Stream};
use cuflow_testing::device::stream;

/// A kernel whose host implementation does nothing.
fn noop(name: &str, src: &str) -> Kernel {
    // SAFETY: every source given here reads and writes only below the count `n` it is given,
    // which each test passes as the length of its buffers, or writes nothing; its host
    // implementation does nothing.
    unsafe { Kernel::new(name, src) }.with_host(|_| Ok(()))
}

/// Launches `k` with `args`: `Ok(true)` when it was refused with
/// [`DeviceError::InvalidArgument`], `Ok(false)` when it ran, or when a CUDA driver older than
/// CUDA 12.4 refused it only because nothing could check a kernel whose signature the source
/// does not establish (see `rt_kernel_errors`): the check against the source let it pass.
fn refused(k: &Kernel, args: &KernelArgs<'_>, s: &Stream) -> Result<bool, DeviceError> {
    match k.launch(s, LaunchConfig::for_num_elems(1), args) {
        Err(DeviceError::InvalidArgument { reason, .. })
            if reason.contains("CUDA 12.4 or later") =>
        {
            eprintln!("not checkable with this driver: {reason}");
            Ok(false)
        }
        Err(DeviceError::InvalidArgument { .. }) => Ok(true),
        Err(e) => Err(e),
        Ok(()) => {
            s.synchronize()?;
            Ok(false)
        }
    }
}

/// The reason `with_compile_option(option)` on kernel `name` of `source` was refused with
/// [`DeviceError::InvalidArgument`] naming the kernel; panics when the option was accepted.
#[track_caller]
fn option_refusal(name: &str, source: &str, option: &str) -> Result<String, DeviceError> {
    match noop(name, source).with_compile_option(option) {
        Err(DeviceError::InvalidArgument { kernel, reason, .. }) => {
            assert_eq!(kernel, name);
            Ok(reason)
        }
        Ok(_) => panic!("compile option {option} was accepted"),
        Err(e) => Err(e),
    }
}

/// Checks that launching `k` with `args` is refused; `accepted` says what went through if not.
#[track_caller]
fn assert_refused(
    k: &Kernel,
    args: &KernelArgs<'_>,
    s: &Stream,
    accepted: &str,
) -> Result<(), DeviceError> {
    assert!(refused(k, args, s)?, "{accepted}");
    Ok(())
}

/// Fails unless `k` accepts `args` (or the driver cannot check them, see [`refused`]).
#[track_caller]
fn assert_accepted(k: &Kernel, args: &KernelArgs<'_>, s: &Stream) -> Result<(), DeviceError> {
    assert!(!refused(k, args, s)?, "the launch was refused");
    Ok(())
}

#[test]
fn pointer_to_pointer_to_const_is_writable_and_holds_pointers() -> Result<(), DeviceError> {
    let s = stream();
    let k = noop(
        "pp",
        r#"extern "C" __global__ void pp(const float** p, unsigned n) {
               if (threadIdx.x < n) p[threadIdx.x] = nullptr; }"#,
    );
    let x = DeviceBuffer::<f32>::zeroed(&s, 4)?;
    assert!(
        refused(&k, KernelArgs::new().input(&x).scalar(4u32), &s)?,
        "a read-only f32 buffer was accepted for `const float** p`"
    );
    assert!(
        refused(&k, KernelArgs::new().output(&x).scalar(4u32), &s)?,
        "a buffer of 4-byte elements was accepted for the 8-byte `const float*` elements"
    );
    let pointers = DeviceBuffer::<u64>::zeroed(&s, 4)?;
    assert_accepted(&k, KernelArgs::new().output(&pointers).scalar(4u32), &s)?;
    Ok(())
}

#[test]
fn a_const_right_before_the_last_star_makes_pointer_elements_read_only() -> Result<(), DeviceError>
{
    let s = stream();
    let k = noop(
        "pcp",
        r#"extern "C" __global__ void pcp(float* const* p, const float* const q[], unsigned n) { }"#,
    );
    let pointers = DeviceBuffer::<u64>::zeroed(&s, 4)?;
    let more = DeviceBuffer::<u64>::zeroed(&s, 4)?;
    assert_accepted(
        &k,
        KernelArgs::new().input(&pointers).input(&more).scalar(4u32),
        &s,
    )?;
    Ok(())
}

#[test]
fn an_inactive_preprocessor_branch_is_not_the_signature() -> Result<(), DeviceError> {
    let s = stream();
    let k = noop(
        "pre",
        r#"#if 0
           extern "C" __global__ void pre(const float* x, unsigned n) { }
           #else
           extern "C" __global__ void pre(float* x, unsigned n) {
               if (threadIdx.x < n) x[threadIdx.x] = 0.0f; }
           #endif"#,
    );
    let x = DeviceBuffer::<f32>::zeroed(&s, 4)?;
    assert!(
        refused(&k, KernelArgs::new().input(&x).scalar(4u32), &s)?,
        "an input buffer was accepted for the compiled `float* x`"
    );
    assert_accepted(&k, KernelArgs::new().output(&x).scalar(4u32), &s)?;
    Ok(())
}

#[test]
fn declarations_that_disagree_take_an_input_only_where_all_are_const() -> Result<(), DeviceError> {
    let s = stream();
    let k = noop(
        "dis",
        r#"#ifdef CUFLOW_NEVER_DEFINED
           extern "C" __global__ void dis(const float* x, const float* y, unsigned n) { }
           #else
           extern "C" __global__ void dis(const float* x, unsigned n) { }
           #endif"#,
    );
    let x = DeviceBuffer::<f32>::zeroed(&s, 4)?;
    let y = DeviceBuffer::<f32>::zeroed(&s, 4)?;
    assert_accepted(&k, KernelArgs::new().input(&x).scalar(4u32), &s)?;
    assert!(
        refused(&k, KernelArgs::new().input(&x).input(&y).scalar(4u32), &s)?,
        "an input buffer was accepted where one declaration has a value"
    );
    // A preprocessor directive inside the parameter list: no parameter is known const.
    let k = noop(
        "inner",
        "extern \"C\" __global__ void inner(\n#if 0\nconst\n#endif\nfloat* x, unsigned n) {\n\
         if (threadIdx.x < n) x[threadIdx.x] = 0.0f; }",
    );
    assert!(refused(&k, KernelArgs::new().input(&x).scalar(4u32), &s)?);
    assert_accepted(&k, KernelArgs::new().output(&x).scalar(4u32), &s)?;
    Ok(())
}

#[test]
fn const_in_a_template_argument_is_not_a_const_pointee() -> Result<(), DeviceError> {
    let s = stream();
    let k = noop(
        "tpl",
        r#"template <typename A, typename B> struct Pair { A a; B b; };
           extern "C" __global__ void tpl(Pair< const int, float >* out, unsigned n) {
               if (threadIdx.x < n) out[threadIdx.x].b = 1.0f; }"#,
    );
    let x = DeviceBuffer::<u64>::zeroed(&s, 4)?;
    assert!(
        refused(&k, KernelArgs::new().input(&x).scalar(4u32), &s)?,
        "an input buffer was accepted for `Pair<const int, float>* out`"
    );
    Ok(())
}

#[test]
fn a_compile_option_that_could_change_the_source_is_refused() -> Result<(), DeviceError> {
    let s = stream();
    let source = r#"extern "C" __global__ void opt(float* x, unsigned n) {
               unsigned i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] = 1.0f; }"#;
    for option in [
        "-Dfloat=double",
        "-DN=4",
        "--define-macro=float=double",
        "-Ufloat",
        "-include",
        "--pre-include=evil.h",
        "-I/tmp",
        "--maxrregcount=",
        "--ftz=maybe",
        "-std=c++17 -Dfloat=double",
        "use_fast_math",
        "--std=c++20 -Dfloat=double",
    ] {
        let reason = option_refusal("opt", source, option)?;
        assert!(
            reason.contains(option) && reason.contains("--use_fast_math"),
            "the refusal of {option} names neither it nor the allowed options: {reason}"
        );
    }
    for option in ["--prec-div=true", "-ftz=false", "-prec-sqrt=false"] {
        noop("opt", source).with_compile_option(option)?;
    }
    let k = noop("opt", source)
        .with_compile_option("--use_fast_math")?
        .with_compile_option("-lineinfo")?
        .with_compile_option("--maxrregcount=64")?
        .with_compile_option("--fmad=false")?
        .with_compile_option("--prec-sqrt=true")?;
    let x = DeviceBuffer::<f32>::zeroed(&s, 4)?;
    assert_accepted(&k, KernelArgs::new().output(&x).scalar(4u32), &s)?;
    assert!(refused(&k, KernelArgs::new().input(&x).scalar(4u32), &s)?);
    Ok(())
}

#[test]
fn an_unnamed_two_word_type_keeps_its_second_word() -> Result<(), DeviceError> {
    let s = stream();
    let k = noop(
        "un",
        r#"extern "C" __global__ void un(unsigned short*, unsigned);
           extern "C" __global__ void un(unsigned short* x, unsigned n) {
               if (threadIdx.x < n) x[threadIdx.x] = 1; }"#,
    );
    let x = DeviceBuffer::<u32>::zeroed(&s, 4)?;
    assert!(
        refused(&k, KernelArgs::new().output(&x).scalar(4u32), &s)?,
        "a u32 buffer was accepted for `unsigned short*`"
    );
    let x = DeviceBuffer::<u16>::zeroed(&s, 4)?;
    assert_accepted(&k, KernelArgs::new().output(&x).scalar(4u32), &s)?;
    Ok(())
}

#[test]
fn vector_elements_are_checked_by_size() -> Result<(), DeviceError> {
    let s = stream();
    let k = noop(
        "vec",
        r#"extern "C" __global__ void vec(float4* v, const double2* w, const short2* h, unsigned n) { }"#,
    );
    let v = DeviceBuffer::<[f32; 4]>::zeroed(&s, 4)?;
    let w = DeviceBuffer::<[f64; 2]>::zeroed(&s, 4)?;
    let h = DeviceBuffer::<u32>::zeroed(&s, 4)?;
    let f = DeviceBuffer::<f32>::zeroed(&s, 16)?;
    assert_accepted(
        &k,
        KernelArgs::new()
            .output(&v)
            .input(&w)
            .input(&h)
            .scalar(4u32),
        &s,
    )?;
    assert_refused(
        &k,
        KernelArgs::new()
            .output(&f)
            .input(&w)
            .input(&h)
            .scalar(4u32),
        &s,
        "an f32 buffer was accepted for `float4* v`",
    )?;
    assert!(refused(
        &k,
        KernelArgs::new()
            .output(&v)
            .input(&w)
            .input(&v)
            .scalar(4u32),
        &s
    )?);
    Ok(())
}

#[test]
fn the_ordinary_signatures_still_pass() -> Result<(), DeviceError> {
    let s = stream();
    let k = noop(
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
    );
    let x = DeviceBuffer::<f32>::zeroed(&s, 4)?;
    let y = DeviceBuffer::<f32>::zeroed(&s, 4)?;
    let h = DeviceBuffer::<half::f16>::zeroed(&s, 4)?;
    let b = DeviceBuffer::<half::bf16>::zeroed(&s, 4)?;
    assert_accepted(
        &k,
        KernelArgs::new()
            .input(&x)
            .output(&y)
            .input(&h)
            .output(&b)
            .scalar(4u64),
        &s,
    )?;
    assert_refused(
        &k,
        KernelArgs::new()
            .input(&x)
            .output(&y)
            .input(&h)
            .output(&b)
            .scalar(4u32),
        &s,
        "a u32 was accepted for `unsigned long long n`",
    )?;
    assert_refused(
        &k,
        KernelArgs::new()
            .input(&x)
            .input(&y)
            .input(&h)
            .output(&b)
            .scalar(4u64),
        &s,
        "an input was accepted for `float* const y`",
    )?;
    Ok(())
}

#[test]
fn a_language_standard_option_is_refused_as_kernels_are_cpp17() -> Result<(), DeviceError> {
    let source = r#"extern "C" __global__ void std_opt(float* x, unsigned n) {
               unsigned i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] = 1.0f; }"#;
    for option in [
        "-std=c++17",
        "--std=c++17",
        "-std=c++20",
        "--std=c++14",
        "-std=c++11",
        "--std=c++03",
    ] {
        let reason = option_refusal("std_opt", source, option)?;
        assert!(
            reason.contains(option) && reason.contains("C++17"),
            "the refusal of {option} does not say kernels are compiled as C++17: {reason}"
        );
    }
    Ok(())
}

#[test]
fn a_type_alias_is_checked_as_the_type_it_names() -> Result<(), DeviceError> {
    let s = stream();
    let k = noop(
        "alias",
        r#"typedef double real;
           using index_t = unsigned long long;
           typedef const float cfloat;
           typedef real scalar_t;
           extern "C" __global__ void alias(scalar_t* x, cfloat* y, index_t n) {
               if (threadIdx.x < n) x[threadIdx.x] = y[threadIdx.x]; }"#,
    );
    let x64 = DeviceBuffer::<f64>::zeroed(&s, 4)?;
    let x32 = DeviceBuffer::<f32>::zeroed(&s, 4)?;
    let y = DeviceBuffer::<f32>::zeroed(&s, 4)?;
    let h = DeviceBuffer::<half::f16>::zeroed(&s, 4)?;
    assert_accepted(
        &k,
        KernelArgs::new().output(&x64).input(&y).scalar(4u64),
        &s,
    )?;
    assert_refused(
        &k,
        KernelArgs::new().output(&x32).input(&y).scalar(4u64),
        &s,
        "an f32 buffer was accepted for `scalar_t* x`, scalar_t being double",
    )?;
    assert_refused(
        &k,
        KernelArgs::new().output(&x64).input(&h).scalar(4u64),
        &s,
        "an f16 buffer was accepted for `cfloat* y`, cfloat being const float",
    )?;
    assert_refused(
        &k,
        KernelArgs::new().output(&x64).input(&y).scalar(4u32),
        &s,
        "a u32 was accepted for `index_t n`, index_t being unsigned long long",
    )?;
    Ok(())
}

#[test]
fn a_pointer_alias_is_a_pointer() -> Result<(), DeviceError> {
    let s = stream();
    let k = noop(
        "palias",
        r#"typedef float* fptr;
           typedef const float* cfptr;
           extern "C" __global__ void palias(fptr x, cfptr y, const fptr z, unsigned n) {
               if (threadIdx.x < n) { x[threadIdx.x] = y[threadIdx.x]; z[threadIdx.x] = 0.0f; } }"#,
    );
    let x = DeviceBuffer::<f32>::zeroed(&s, 4)?;
    let y = DeviceBuffer::<f32>::zeroed(&s, 4)?;
    let z = DeviceBuffer::<f32>::zeroed(&s, 4)?;
    assert_accepted(
        &k,
        KernelArgs::new()
            .output(&x)
            .input(&y)
            .output(&z)
            .scalar(4u32),
        &s,
    )?;
    assert_refused(
        &k,
        KernelArgs::new()
            .scalar(0x1000u64)
            .input(&y)
            .output(&z)
            .scalar(4u32),
        &s,
        "a u64 value was accepted for the pointer `fptr x`",
    )?;
    assert_refused(
        &k,
        KernelArgs::new()
            .output(&x)
            .input(&y)
            .input(&z)
            .scalar(4u32),
        &s,
        "an input was accepted for `const fptr z`, a const pointer to writable floats",
    )?;
    let d = DeviceBuffer::<half::f16>::zeroed(&s, 4)?;
    assert_refused(
        &k,
        KernelArgs::new()
            .output(&d)
            .input(&y)
            .output(&z)
            .scalar(4u32),
        &s,
        "an f16 buffer was accepted for `fptr x`",
    )?;
    Ok(())
}

#[test]
fn an_alias_the_check_cannot_resolve_is_refused() -> Result<(), DeviceError> {
    let s = stream();
    let x = DeviceBuffer::<f32>::zeroed(&s, 4)?;
    let sources = [
        (
            "two_defs",
            "real",
            r#"#ifdef CUFLOW_NEVER_DEFINED
               typedef double real;
               #else
               typedef float real;
               #endif
               extern "C" __global__ void two_defs(real* x, unsigned n) {
                   if (threadIdx.x < n) x[threadIdx.x] = 0; }"#,
        ),
        (
            "tpl_alias",
            "ptr",
            r#"template <typename T> using ptr = T*;
               extern "C" __global__ void tpl_alias(ptr<float> x, unsigned n) {
                   if (threadIdx.x < n) x[threadIdx.x] = 0; }"#,
        ),
        (
            "arr_alias",
            "vec3",
            r#"typedef float vec3[3];
               extern "C" __global__ void arr_alias(vec3* x, unsigned n) {
                   if (threadIdx.x < n) x[threadIdx.x][0] = 0; }"#,
        ),
    ];
    for (name, alias, source) in sources {
        let k = noop(name, source);
        for args in [
            KernelArgs::new().output(&x).scalar(4u32),
            KernelArgs::new().scalar(0x1000u64).scalar(4u32),
        ] {
            match k.launch(&s, LaunchConfig::for_num_elems(1), args) {
                Err(DeviceError::InvalidArgument { index, reason, .. }) => {
                    assert_eq!(index, 0, "{name}: {reason}");
                    assert!(
                        reason.contains(alias),
                        "{name}: the refusal does not name the alias `{alias}`: {reason}"
                    );
                }
                Ok(()) => panic!("{name}: a launch through the alias `{alias}` was accepted"),
                Err(e) => return Err(e),
            }
        }
    }
    // An alias of a struct is checked as the struct is: by kind.
    let k = noop(
        "struct_alias",
        r#"typedef struct { float a, b; } pair;
           extern "C" __global__ void struct_alias(pair* p, unsigned n) {
               if (threadIdx.x < n) p[threadIdx.x].a = 0; }"#,
    );
    let pairs = DeviceBuffer::<[f32; 2]>::zeroed(&s, 4)?;
    assert_accepted(&k, KernelArgs::new().output(&pairs).scalar(4u32), &s)?;
    Ok(())
}

#[test]
fn cuda_complex_elements_are_checked_by_size() -> Result<(), DeviceError> {
    let s = stream();
    let k = noop(
        "cplx",
        r#"#include <cuComplex.h>
           extern "C" __global__ void cplx(cuFloatComplex* x, const cuDoubleComplex* y, unsigned n) {
               if (threadIdx.x < n) x[threadIdx.x] = cuComplexDoubleToFloat(y[threadIdx.x]); }"#,
    );
    let x = DeviceBuffer::<[f32; 2]>::zeroed(&s, 4)?;
    let y = DeviceBuffer::<[f64; 2]>::zeroed(&s, 4)?;
    let f = DeviceBuffer::<f32>::zeroed(&s, 8)?;
    assert_accepted(&k, KernelArgs::new().output(&x).input(&y).scalar(4u32), &s)?;
    assert!(
        refused(&k, KernelArgs::new().output(&f).input(&y).scalar(4u32), &s)?,
        "an f32 buffer was accepted for `cuFloatComplex* x`"
    );
    assert!(
        refused(&k, KernelArgs::new().output(&x).input(&x).scalar(4u32), &s)?,
        "a buffer of 8-byte elements was accepted for `const cuDoubleComplex* y`"
    );
    Ok(())
}

#[test]
fn an_alias_a_function_like_macro_declares_is_refused() -> Result<(), DeviceError> {
    let s = stream();
    let x = DeviceBuffer::<f32>::zeroed(&s, 4)?;
    let sources = [
        (
            "macro_param_alias",
            "real",
            r#"typedef float T;
               #define DECLARE(T) typedef T real;
               DECLARE(double)
               extern "C" __global__ void macro_param_alias(real* x, unsigned n) {
                   if (threadIdx.x < n) x[threadIdx.x] = 0; }"#,
        ),
        (
            "pasted_alias",
            "real_t",
            r#"#define DECLARE(T, NAME) typedef T NAME##_t;
               DECLARE(double, real)
               extern "C" __global__ void pasted_alias(real_t* x, unsigned n) {
                   if (threadIdx.x < n) x[threadIdx.x] = 0; }"#,
        ),
    ];
    for (name, alias, source) in sources {
        match noop(name, source).launch(
            &s,
            LaunchConfig::for_num_elems(1),
            KernelArgs::new().output(&x).scalar(4u32),
        ) {
            Err(DeviceError::InvalidArgument { index, reason, .. }) => {
                assert_eq!(index, 0, "{name}: {reason}");
                assert!(
                    reason.contains(alias),
                    "{name}: the refusal does not name `{alias}`: {reason}"
                );
            }
            Ok(()) => panic!("{name}: an f32 buffer was accepted for `{alias}* x`"),
            Err(e) => return Err(e),
        }
    }
    // Types the source declares as structs stay checked by kind beside such a macro.
    let k = noop(
        "macro_struct",
        r#"#define DECLARE(T, NAME) typedef T NAME;
           DECLARE(float, real)
           struct Pair { float a, b; };
           extern "C" __global__ void macro_struct(Pair* p, float4* v, unsigned n) {
               if (threadIdx.x < n) p[threadIdx.x].a = v[threadIdx.x].x; }"#,
    );
    let pairs = DeviceBuffer::<[f32; 2]>::zeroed(&s, 4)?;
    let v = DeviceBuffer::<[f32; 4]>::zeroed(&s, 4)?;
    assert_accepted(
        &k,
        KernelArgs::new().output(&pairs).output(&v).scalar(4u32),
        &s,
    )?;
    Ok(())
}

#[test]
fn an_alias_naming_the_storage_of_another_type_takes_elements_of_its_size(
) -> Result<(), DeviceError> {
    let s = stream();
    let k = noop(
        "bits",
        r#"typedef unsigned short f16_bits;
           extern "C" __global__ void bits(f16_bits* out, const f16_bits* x, unsigned n) {
               if (threadIdx.x < n) out[threadIdx.x] = x[threadIdx.x]; }"#,
    );
    let out = DeviceBuffer::<half::f16>::zeroed(&s, 4)?;
    let x = DeviceBuffer::<half::f16>::zeroed(&s, 4)?;
    assert_accepted(
        &k,
        KernelArgs::new().output(&out).input(&x).scalar(4u32),
        &s,
    )?;
    let narrow = DeviceBuffer::<u8>::zeroed(&s, 4)?;
    assert_refused(
        &k,
        KernelArgs::new().output(&narrow).input(&x).scalar(4u32),
        &s,
        "a buffer of 1-byte elements was accepted for `f16_bits* out`, f16_bits being 2 bytes",
    )?;
    Ok(())
}

#[test]
fn an_alias_takes_a_buffer_of_wider_elements_as_scratch_but_never_narrower(
) -> Result<(), DeviceError> {
    let s = stream();
    let k = noop(
        "scratch",
        r#"typedef float acc_t;
           typedef double wide_t;
           extern "C" __global__ void scratch(acc_t* parts, wide_t* w, unsigned n) {
               if (threadIdx.x < n) { parts[threadIdx.x] = 0.0f; w[threadIdx.x] = 0.0; } }"#,
    );
    let i64s = DeviceBuffer::<i64>::zeroed(&s, 4)?;
    let f64s = DeviceBuffer::<f64>::zeroed(&s, 4)?;
    let f32s = DeviceBuffer::<f32>::zeroed(&s, 4)?;
    let bytes = DeviceBuffer::<[u8; 12]>::zeroed(&s, 4)?;
    assert_accepted(
        &k,
        KernelArgs::new().output(&i64s).output(&f64s).scalar(4u32),
        &s,
    )?;
    assert_refused(
        &k,
        KernelArgs::new().output(&i64s).output(&f32s).scalar(4u32),
        &s,
        "a buffer of 4-byte elements was accepted for `wide_t* w`, wide_t being 8 bytes",
    )?;
    assert_refused(
        &k,
        KernelArgs::new().output(&i64s).output(&bytes).scalar(4u32),
        &s,
        "a buffer of 12-byte elements was accepted for the 8-byte `wide_t* w`",
    )?;
    Ok(())
}

#[test]
fn a_struct_of_one_plain_type_takes_elements_of_its_size() -> Result<(), DeviceError> {
    let s = stream();
    let k = noop(
        "structs",
        r#"struct Vec3 { float x, y, z; };
           typedef struct { double re; double im; } complex_t;
           struct Mixed { float a; double b; };
           extern "C" __global__ void structs(Vec3* v, const complex_t* c, Mixed* m, unsigned n) {
               if (threadIdx.x < n) { v[threadIdx.x].x = (float)c[threadIdx.x].re; m[threadIdx.x].a = 0; } }"#,
    );
    let v = DeviceBuffer::<[f32; 3]>::zeroed(&s, 4)?;
    let c = DeviceBuffer::<[f64; 2]>::zeroed(&s, 4)?;
    let m = DeviceBuffer::<[f64; 2]>::zeroed(&s, 4)?;
    let f = DeviceBuffer::<f32>::zeroed(&s, 4)?;
    let d = DeviceBuffer::<f64>::zeroed(&s, 4)?;
    assert_accepted(
        &k,
        KernelArgs::new()
            .output(&v)
            .input(&c)
            .output(&m)
            .scalar(4u32),
        &s,
    )?;
    assert_refused(
        &k,
        KernelArgs::new()
            .output(&f)
            .input(&c)
            .output(&m)
            .scalar(4u32),
        &s,
        "an f32 buffer was accepted for `Vec3* v`, Vec3 being 12 bytes",
    )?;
    assert_refused(
        &k,
        KernelArgs::new()
            .output(&v)
            .input(&d)
            .output(&m)
            .scalar(4u32),
        &s,
        "an f64 buffer was accepted for `const complex_t* c`, complex_t being 16 bytes",
    )?;
    Ok(())
}

#[test]
fn an_array_parameter_sized_by_a_product_is_an_array_of_its_elements() -> Result<(), DeviceError> {
    let s = stream();
    let k = noop(
        "arr_product",
        r#"extern "C" __global__ void arr_product(const float x[2*2], float* y, unsigned n) {
               if (threadIdx.x < n) y[threadIdx.x] = x[threadIdx.x]; }"#,
    );
    let (x, y) = (
        DeviceBuffer::<f32>::zeroed(&s, 4)?,
        DeviceBuffer::<f32>::zeroed(&s, 4)?,
    );
    assert!(
        !refused(&k, KernelArgs::new().input(&x).output(&y).scalar(4u32), &s)?,
        "f32 buffers were refused for `const float x[2*2]`"
    );
    let wide = DeviceBuffer::<f64>::zeroed(&s, 4)?;
    assert_refused(
        &k,
        KernelArgs::new().input(&wide).output(&y).scalar(4u32),
        &s,
        "an f64 buffer was accepted for `const float x[2*2]`",
    )?;
    Ok(())
}

#[test]
fn a_parameter_type_ending_in_a_multibyte_character_is_checked_or_refused() {
    let s = stream();
    let k = noop(
        "unicode_type",
        "struct Pointé { float x; float y; };\n\
         extern \"C\" __global__ void unicode_type(Pointé p, float* y) { y[0] = p.x; }",
    );
    let y = DeviceBuffer::<f32>::zeroed(&s, 1).expect("y");
    let launched = k.launch(
        &s,
        LaunchConfig::for_num_elems(1),
        KernelArgs::new().scalar([1.0f32, 2.0]).output(&y),
    );
    match launched {
        Ok(()) => s.synchronize().expect("the launch ran"),
        Err(DeviceError::InvalidArgument { .. } | DeviceError::Compile { .. }) => {}
        Err(e) => panic!("unexpected error: {e}"),
    }
}
