"""Writes the production decode kernels' CUDA C (attention and the three fused GEMVs of a
layer, for the 1B shape: head width 64, groups of 4, and the streaming GEMVs of the same three
fusions) as headers the harnesses include, from the Rust sources in
crates/tensor/src/kernels/decode/."""
import pathlib

here = pathlib.Path(__file__).resolve().parent
decode = here.parents[2] / "crates/tensor/src/kernels/decode"
defs = (
    "typedef unsigned short T_bf16; typedef float A_bf16;\n"
    "__device__ __forceinline__ A_bf16 ld_bf16(T_bf16 x) { return __uint_as_float(((unsigned)x) << 16); }\n"
    "__device__ __forceinline__ T_bf16 st_bf16(A_bf16 x) { unsigned u = __float_as_uint(x); "
    "if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)0x7fc0; "
    "return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16); }\n"
)
att = (decode / "attention.rs").read_text()
src = att.split('const SOURCE: &str = r#"', 1)[1].split('"#;', 1)[0]
src = (src.replace("@DEFS@", defs).replace("@MAX_GROUP@", "8").replace("@THREADS@", "256")
          .replace("@HD@", "64").replace("@G@", "4"))
(here / "attention_gen.cuh").write_text(src)
# The same with its block barriers named, so that a 512-thread block can run it on 256 threads.
(here / "attention_gen2.cuh").write_text(
    "#ifndef ATT_SYNC\n#define ATT_SYNC() __syncthreads()\n#endif\n" + src.replace("__syncthreads()", "ATT_SYNC()"))
g = (decode / "gemv.rs").read_text()
gs = g.split('format!(\n        r#"', 1)[1].split('"#,', 1)[0]
out = []
for name, norm, epi in [("decode_rms_norm_gemv", 1, 0), ("decode_gemv_add", 0, 1),
                        ("decode_rms_norm_gemv_swiglu", 1, 2)]:
    s = gs
    for k, v in dict(defs="", norm=norm, epilogue=epi, rows=4, unroll=2, stage_max=8192,
                     min_blocks=2, name=name).items():
        s = s.replace("{" + k + "}", str(v))
    s = s.replace("{{", "{").replace("}}", "}")
    s = s.replace("__device__ __forceinline__", "__device__ static __forceinline__")
    out.append("namespace v%d {\n%s\n#undef IN_NORM\n#undef EPILOGUE\n#undef ROWS\n#undef UNROLL\n"
               "#undef STAGE_MAX\n}\n" % (epi, s))
(here / "gemv_gen.cuh").write_text("\n".join(out))

# The streaming GEMVs (RING_SOURCE), in namespaces r0 (RMS norm, store), r1 (residual add) and
# r2 (RMS norm, SwiGLU).
rs = g.split('const RING_SOURCE: &str = r#"', 1)[1].split('"#;', 1)[0]
out = []
for name, norm, epi in [("decode_rms_norm_gemv_ring", 1, 0), ("decode_gemv_add_ring", 0, 1),
                        ("decode_rms_norm_gemv_swiglu_ring", 1, 2)]:
    s = rs
    for k, v in dict(DEFS="", NAME=name, NORM=norm, EPILOGUE=epi, SLOTS=4, CHUNK=32768, THREADS=288).items():
        s = s.replace("@" + k + "@", str(v))
    s = s.replace("__device__ __forceinline__", "__device__ static __forceinline__")
    out.append("namespace r%d {\n%s\n#undef IN_NORM\n#undef EPILOGUE\n#undef SLOTS\n#undef CHUNK\n"
               "#undef LT\n#undef SLAB\n#undef SPW\n#undef CSYNC\n}\n" % (epi, s))
(here / "gemv_ring_gen.cuh").write_text("\n".join(out))
