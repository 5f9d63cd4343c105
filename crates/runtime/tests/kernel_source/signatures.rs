//! Kernel signatures generated from a grammar of the parameter types the reader knows, each
//! with a model of what the documented check accepts (see `rt_generated_kernel_signatures`).

use rand::rngs::StdRng;
use rand::Rng;

use super::check_model::*;
use super::*;

/// Plain C types, spelled as sources spell them.
pub const PLAIN_TYPES: &[(&str, Plain)] = &[
    ("float", Plain::Float(4)),
    ("double", Plain::Float(8)),
    ("__half", Plain::Float(2)),
    ("half", Plain::Float(2)),
    ("__nv_bfloat16", Plain::BFloat16),
    ("nv_bfloat16", Plain::BFloat16),
    ("bool", Plain::Bool),
    ("char", Plain::Int(1)),
    ("signed char", Plain::Int(1)),
    ("unsigned char", Plain::Int(1)),
    ("int8_t", Plain::Int(1)),
    ("uint8_t", Plain::Int(1)),
    ("short", Plain::Int(2)),
    ("short int", Plain::Int(2)),
    ("unsigned short", Plain::Int(2)),
    ("int16_t", Plain::Int(2)),
    ("uint16_t", Plain::Int(2)),
    ("int", Plain::Int(4)),
    ("signed", Plain::Int(4)),
    ("unsigned", Plain::Int(4)),
    ("unsigned int", Plain::Int(4)),
    ("int32_t", Plain::Int(4)),
    ("uint32_t", Plain::Int(4)),
    ("long", Plain::Int(8)),
    ("long int", Plain::Int(8)),
    ("unsigned long", Plain::Int(8)),
    ("long long", Plain::Int(8)),
    ("long long int", Plain::Int(8)),
    ("unsigned long long", Plain::Int(8)),
    ("int64_t", Plain::Int(8)),
    ("uint64_t", Plain::Int(8)),
    ("size_t", Plain::Int(8)),
    ("ptrdiff_t", Plain::Int(8)),
];

/// CUDA's vector types and header names for them, with their sizes.
pub const VECTOR_TYPES: &[(&str, usize)] = &[
    ("float2", 8),
    ("float3", 12),
    ("float4", 16),
    ("double2", 16),
    ("double4", 32),
    ("int2", 8),
    ("int4", 16),
    ("uint3", 12),
    ("uchar4", 4),
    ("char2", 2),
    ("short2", 4),
    ("ushort4", 8),
    ("longlong2", 16),
    ("__half2", 4),
    ("__nv_bfloat162", 4),
    ("cuFloatComplex", 8),
    ("cuDoubleComplex", 16),
    ("dim3", 12),
];

/// Types from headers the source includes: the check cannot know them.
pub const HEADER_TYPES: &[&str] = &["curandState", "cudaTextureObject_t", "CUtensorMap"];

/// What goes between two tokens of a declaration (nothing only where that keeps them apart).
pub const SEPARATORS: &[&str] = &[
    "",
    " ",
    " ",
    " ",
    "  ",
    "\n",
    "\t",
    "\n    ",
    " /* a comment */ ",
    "/**/",
    " // a comment\n",
    " \\\n",
];

/// What goes between two tokens of a macro's body: one line, or lines continued.
pub const MACRO_SEPARATORS: &[&str] =
    &["", " ", " ", "  ", "/**/", " /* a comment */ ", " \\\n    "];

/// Parameter names, some of them not ASCII.
pub const NAMES: &[&str] = &[
    "x", "y", "out", "in", "n", "count", "data_", "alpha", "données", "ñ",
];

pub fn ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// `tokens` joined by separators drawn from `separators`.
pub fn spaced<S: AsRef<str>>(rng: &mut StdRng, tokens: &[S], separators: &[&str]) -> String {
    let mut out = String::new();
    for t in tokens {
        let t = t.as_ref();
        if !out.is_empty() {
            let apart = out.chars().next_back().is_some_and(ident_char)
                && t.chars().next().is_some_and(ident_char);
            let sep = loop {
                let sep = separators[rng.gen_range(0..separators.len())];
                if !(apart && sep.is_empty()) {
                    break sep;
                }
            };
            out.push_str(sep);
        }
        out.push_str(t);
    }
    out
}

/// The declarations a generated source makes before its kernel.
#[derive(Default)]
pub struct Preamble {
    pub lines: Vec<String>,
    pub count: usize,
    /// A function-like macro declares aliases: a type name the source does not declare
    /// cannot be resolved.
    pub through_macros: bool,
}

impl Preamble {
    /// A new name, `stem` followed by a number: no two declarations share one.
    pub fn name(&mut self, stem: &str) -> String {
        self.count += 1;
        format!("{stem}{}_", self.count)
    }
}

/// The type a parameter is declared with, before its declarator.
#[derive(Clone, Debug)]
pub struct Base {
    pub words: Vec<String>,
    /// What the check accepts for elements of this type behind a pointer.
    pub pointee: Accepts,
    /// What it accepts for a value of this type (by value: at most 16 bytes, or refused).
    pub value: Accepts,
    /// Named through a type alias: pointers it points to are checked as 8-byte storage.
    pub through_alias: bool,
    /// The alias includes `const` (`typedef const float cfloat;`).
    pub is_const: bool,
    /// A name the source does not declare (a header's type).
    pub undeclared: bool,
}

impl Base {
    pub fn new(words: Vec<String>, pointee: Accepts, value: Accepts) -> Base {
        Base {
            words,
            pointee,
            value,
            through_alias: false,
            is_const: false,
            undeclared: false,
        }
    }

    pub fn aliased(name: String, size: usize) -> Base {
        Base {
            through_alias: true,
            ..Base::new(vec![name], Accepts::Multiple(size), Accepts::Size(size))
        }
    }
}

pub fn words(s: &str) -> Vec<String> {
    s.split_whitespace().map(str::to_string).collect()
}

pub fn plain_type(rng: &mut StdRng) -> (&'static str, Plain) {
    PLAIN_TYPES[rng.gen_range(0..PLAIN_TYPES.len())]
}

/// A type spelled directly: a plain type, or a vector type.
pub fn direct(rng: &mut StdRng) -> (&'static str, Accepts, usize) {
    if rng.gen_ratio(3, 4) {
        let (spelling, plain) = plain_type(rng);
        (spelling, Accepts::Plain(plain), plain.size())
    } else {
        let (spelling, size) = VECTOR_TYPES[rng.gen_range(0..VECTOR_TYPES.len())];
        (spelling, Accepts::Size(size), size)
    }
}

/// A base type at random, declaring what it needs in `pre`.
pub fn base(rng: &mut StdRng, pre: &mut Preamble) -> Base {
    match rng.gen_range(0..11) {
        0..=2 => {
            let (spelling, accepts, _) = direct(rng);
            Base::new(words(spelling), accepts, accepts)
        }
        3 => {
            // An alias, or an alias of an alias.
            let (spelling, _, size) = direct(rng);
            let name = pre.name("real");
            pre.lines.push(if rng.gen() {
                format!("typedef {spelling} {name};")
            } else {
                format!("using {name} = {spelling};")
            });
            if rng.gen() {
                let outer = pre.name("scalar");
                pre.lines.push(format!("typedef {name} {outer};"));
                return Base::aliased(outer, size);
            }
            Base::aliased(name, size)
        }
        4 => {
            let (spelling, _, size) = direct(rng);
            let name = pre.name("cval");
            pre.lines.push(format!("typedef const {spelling} {name};"));
            Base {
                is_const: true,
                ..Base::aliased(name, size)
            }
        }
        5 | 6 => {
            // A struct of one plain type, now and then larger than 255 bytes.
            let (spelling, plain) = plain_type(rng);
            let name = pre.name("S");
            let (fields, count) = if rng.gen_ratio(1, 6) {
                let count = 256 / plain.size();
                (format!("{spelling} v[{count}];"), count)
            } else {
                let n = rng.gen_range(1..=4);
                let names: Vec<String> = (0..n).map(|i| format!("f{i}")).collect();
                let mut fields = format!("{spelling} {};", names.join(", "));
                let mut count = n;
                if rng.gen() {
                    let m = rng.gen_range(1..=3);
                    let _ = write!(fields, " {spelling} rest[{m}][2];");
                    count += 2 * m;
                }
                (fields, count)
            };
            let mut base = Base::aliased(name.clone(), count * plain.size());
            match rng.gen_range(0..3) {
                0 => pre.lines.push(format!("struct {name} {{ {fields} }};")),
                1 => {
                    pre.lines.push(format!("struct {name} {{ {fields} }};"));
                    base.words.insert(0, "struct".into());
                }
                _ => pre
                    .lines
                    .push(format!("typedef struct {{ {fields} }} {name};")),
            }
            base
        }
        7 => {
            // A macro of a type: read as if written out.
            let (spelling, accepts, _) = direct(rng);
            let name = pre.name("M");
            pre.lines.push(format!("#define {name} {spelling}"));
            Base::new(vec![name], accepts, accepts)
        }
        8 => {
            // A macro naming an alias.
            let (spelling, _, size) = direct(rng);
            let alias = pre.name("t");
            let name = pre.name("M");
            pre.lines.push(format!("typedef {spelling} {alias};"));
            pre.lines.push(format!("#define {name} {alias}"));
            Base::aliased(name, size)
        }
        _ => opaque(rng, pre),
    }
}

/// A type the check does not know: checked by kind.
pub fn opaque(rng: &mut StdRng, pre: &mut Preamble) -> Base {
    let any = |words: Vec<String>| Base::new(words, Accepts::Any, Accepts::Any);
    match rng.gen_range(0..6) {
        0 => {
            let name = pre.name("Box");
            pre.lines
                .push(format!("template <typename T> struct {name} {{ T v; }};"));
            let (spelling, _, _) = direct(rng);
            let mut w = vec![name, "<".into()];
            w.extend(words(spelling));
            w.push(">".into());
            any(w)
        }
        1 => {
            let name = pre.name("Pair");
            pre.lines.push(format!(
                "template <typename A, class B> struct {name} {{ A a; B b; }};"
            ));
            any(words(&format!("{name} < const int , float >")))
        }
        2 => {
            let name = pre.name("Mixed");
            pre.lines
                .push(format!("struct {name} {{ float a; double b; }};"));
            any(vec![name])
        }
        3 => {
            let name = pre.name("Aligned");
            pre.lines
                .push(format!("struct __align__(16) {name} {{ float v[4]; }};"));
            any(vec![name])
        }
        4 => {
            let name = pre.name("Color");
            pre.lines.push(if rng.gen() {
                format!("enum {name} {{ RED_{name}, GREEN_{name} }};")
            } else {
                format!("enum class {name} : int {{ Red, Green }};")
            });
            any(vec![name])
        }
        _ => Base {
            undeclared: true,
            ..any(vec![
                HEADER_TYPES[rng.gen_range(0..HEADER_TYPES.len())].into()
            ])
        },
    }
}

/// One generated parameter: its tokens, with [`NAME`] where its name goes.
#[derive(Clone, Debug)]
pub struct GenParam {
    pub tokens: Vec<String>,
    pub model: ParamModel,
}

/// Where a parameter's name goes among its tokens.
pub const NAME: &str = "\u{0}NAME";

/// The tokens of `form`, where `B` stands for the base's words and `N` for the name.
pub fn form(base: &[String], form: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    for t in form {
        match *t {
            "B" => out.extend(base.iter().cloned()),
            "N" => out.push(NAME.to_string()),
            other => out.push(other.to_string()),
        }
    }
    out
}

/// Declarators of a pointer to the base: the form, and whether it makes the elements `const`.
pub const POINTER_FORMS: &[(&[&str], bool)] = &[
    (&["B", "*", "N"], false),
    (&["const", "B", "*", "N"], true),
    (&["B", "const", "*", "N"], true),
    (&["B", "*", "__restrict__", "N"], false),
    (&["const", "B", "*", "__restrict__", "N"], true),
    (&["B", "*", "const", "N"], false),
    (&["const", "B", "*", "const", "N"], true),
    (&["volatile", "B", "*", "N"], false),
    (&["B", "N", "[", "]"], false),
    (&["const", "B", "N", "[", "]"], true),
    (&["B", "N", "[", "4", "]"], false),
    (&["B", "const", "N", "[", "]"], true),
];

/// Declarators of a pointer to pointers to the base, and whether those pointers are `const`.
pub const POINTER_POINTER_FORMS: &[(&[&str], bool)] = &[
    (&["B", "*", "*", "N"], false),
    (&["B", "*", "const", "*", "N"], true),
    (&["const", "B", "*", "*", "N"], false),
    (&["const", "B", "*", "const", "*", "N"], true),
    (&["B", "*", "N", "[", "]"], false),
    (&["B", "*", "const", "N", "[", "]"], true),
    (&["B", "*", "*", "const", "N"], false),
];

/// Declarators of a value of the base.
pub const VALUE_FORMS: &[&[&str]] = &[
    &["B", "N"],
    &["const", "B", "N"],
    &["B", "const", "N"],
    &["__grid_constant__", "const", "B", "N"],
];

/// A parameter at random, declaring what it needs in `pre`.
pub fn param(rng: &mut StdRng, pre: &mut Preamble) -> GenParam {
    let mut p = declarator(rng, pre);
    // An attribute, now and then: it does not change the parameter.
    match rng.gen_range(0..12) {
        0 => {
            p.tokens
                .splice(0..0, ["[[", "maybe_unused", "]]"].map(String::from));
        }
        1 => p
            .tokens
            .extend(["__attribute__", "((", "unused", "))"].map(String::from)),
        _ => {}
    }
    p
}

/// A parameter's type and declarator, without attributes.
pub fn declarator(rng: &mut StdRng, pre: &mut Preamble) -> GenParam {
    let through_macros = pre.through_macros;
    let checked = |b: &Base, model: ParamModel| {
        if b.undeclared && through_macros {
            ParamModel::Unresolved
        } else {
            model
        }
    };
    match rng.gen_range(0..14) {
        0..=3 => {
            let b = base(rng, pre);
            let f = VALUE_FORMS[rng.gen_range(0..VALUE_FORMS.len())];
            GenParam {
                tokens: form(&b.words, f),
                model: checked(&b, ParamModel::Value(b.value)),
            }
        }
        4..=7 => {
            let b = base(rng, pre);
            let (f, is_const) = POINTER_FORMS[rng.gen_range(0..POINTER_FORMS.len())];
            let model = ParamModel::Pointer {
                writable: !(is_const || b.is_const),
                elem: b.pointee,
            };
            GenParam {
                tokens: form(&b.words, f),
                model: checked(&b, model),
            }
        }
        8 => {
            let b = base(rng, pre);
            let (f, is_const) =
                POINTER_POINTER_FORMS[rng.gen_range(0..POINTER_POINTER_FORMS.len())];
            let elem = if b.through_alias {
                Accepts::Multiple(8)
            } else {
                Accepts::Size(8)
            };
            GenParam {
                tokens: form(&b.words, f),
                model: checked(
                    &b,
                    ParamModel::Pointer {
                        writable: !is_const,
                        elem,
                    },
                ),
            }
        }
        9 => {
            // A function pointer, or an array of arrays: a pointer to elements the check does
            // not know.
            let b = base(rng, pre);
            let (f, writable): (&[&str], bool) = if rng.gen() {
                (
                    &["B", "(", "*", "N", ")", "(", "int", ",", "float", ")"],
                    true,
                )
            } else {
                (&["B", "N", "[", "]", "[", "4", "]"], !b.is_const)
            };
            GenParam {
                tokens: form(&b.words, f),
                model: checked(
                    &b,
                    ParamModel::Pointer {
                        writable,
                        elem: Accepts::Any,
                    },
                ),
            }
        }
        10 | 11 => {
            // An alias of a pointer type: a qualifier before it qualifies the pointer.
            let (spelling, _, size) = direct(rng);
            let alias_const = rng.gen();
            let pointee = if alias_const {
                format!("const {spelling}*")
            } else {
                format!("{spelling}*")
            };
            let name = pre.name("ptr");
            pre.lines.push(if rng.gen() {
                format!("typedef {pointee} {name};")
            } else {
                format!("using {name} = {pointee};")
            });
            let forms: &[(&[&str], Option<bool>)] = &[
                (&["B", "N"], None),
                (&["const", "B", "N"], None),
                (&["B", "const", "N"], None),
                (&["B", "*", "N"], Some(true)),
                (&["const", "B", "*", "N"], Some(false)),
                (&["B", "const", "*", "N"], Some(false)),
            ];
            let (f, outer) = forms[rng.gen_range(0..forms.len())];
            let model = match outer {
                None => ParamModel::Pointer {
                    writable: !alias_const,
                    elem: Accepts::Multiple(size),
                },
                Some(writable) => ParamModel::Pointer {
                    writable,
                    elem: Accepts::Multiple(8),
                },
            };
            GenParam {
                tokens: form(&[name], f),
                model,
            }
        }
        _ => {
            // A macro of a pointer type: its text is substituted, `const` before it included.
            let (spelling, accepts, _) = direct(rng);
            let macro_const = rng.gen();
            let name = pre.name("P");
            pre.lines.push(if macro_const {
                format!("#define {name} const {spelling}*")
            } else {
                format!("#define {name} {spelling}*")
            });
            let forms: &[(&[&str], bool)] = &[
                (&["B", "N"], false),
                (&["const", "B", "N"], true),
                (&["B", "const", "N"], false),
            ];
            let (f, is_const) = forms[rng.gen_range(0..forms.len())];
            GenParam {
                tokens: form(&[name], f),
                model: ParamModel::Pointer {
                    writable: !(is_const || macro_const),
                    elem: accepts,
                },
            }
        }
    }
}

/// A parameter list: each parameter named (or, now and then, not; one of them, now and then,
/// `half`, a type's name), its tokens between separators drawn from `separators`.
pub fn parameter_list(rng: &mut StdRng, params: &[GenParam], separators: &[&str]) -> String {
    if params.is_empty() {
        return ["", "void", " ", " void "][rng.gen_range(0..4)].to_string();
    }
    let mut tokens: Vec<String> = Vec::new();
    let half = rng.gen_ratio(1, 4).then(|| rng.gen_range(0..params.len()));
    for (i, p) in params.iter().enumerate() {
        if i > 0 {
            tokens.push(",".into());
        }
        let name = if half == Some(i) {
            "half".to_string()
        } else {
            format!("{}{i}", NAMES[rng.gen_range(0..NAMES.len())])
        };
        let unnamed = rng.gen_ratio(1, 8);
        for t in &p.tokens {
            if t == NAME {
                if !unnamed {
                    tokens.push(name.clone());
                }
            } else {
                tokens.push(t.clone());
            }
        }
    }
    spaced(rng, &tokens, separators)
}

/// Declarations beside the kernel that it must not be confused with; `{K}` is its name.
pub const DECOYS: &[&str] = &[
    "// __global__ void {K}(int ignored) {}",
    "/* extern \"C\" __global__ void {K}(double* ignored); */",
    "extern \"C\" __global__ void {K}_other(double* y, int n) {}",
    "extern \"C\" __global__ void other_{K}(const char* s) {}",
    "__device__ float {K}_helper(float v) { return v * 2.0f; }",
    "template <typename T> __global__ void {K}_t(T* x) {}",
    "#define IDX(i) ((i) * 2)",
    "__device__ void log_{K}() { printf(\"__global__ void {K}(int) /* %d\\n\", 1); }",
    "__device__ const char* url_{K}() { return \"http://example.com/{K}(\"; }",
    "__device__ char quote_{K}() { return '\"'; }",
    "__device__ const char* raw_{K}() { return R\"x(__global__ void {K}(int); /* \")x\"; }",
    "__device__ int thousands_{K}() { return 1'000'000; }",
    "extern \"C\" __global__ void é{K}(double d) {}",
    "extern \"C\" __global__ void {K}é(double d) {}",
    "#error \"unused\" isn't compiled",
];

/// A decoy that makes type names the source does not declare unresolvable.
pub const DECLARING_MACRO: &str =
    "#define DECLARE(T, NAME) typedef T NAME;\nDECLARE(float, declared_by_a_macro)";

/// A kernel head (`extern "C" __global__ void NAME(LIST)`), in one of the ways sources write it.
pub fn head(rng: &mut StdRng, name: &str, list: &str) -> String {
    match rng.gen_range(0..4) {
        0 => format!("extern \"C\" __global__ void {name}({list})"),
        1 => format!("extern \"C\" __global__ void __launch_bounds__(256) {name}({list})"),
        2 => format!("extern \"C\"\n__global__\nvoid\n{name} ({list})"),
        _ => format!("extern \"C\" __global__ void __launch_bounds__(256, 2)\n{name}(\n{list}\n)"),
    }
}

pub const BODY: &str = "{\n    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\n    \
                    if (i == 0) { printf(\"done\\n\"); }\n}";

/// A declaration of kernel `name` with `params` (`None`: one the check cannot read), a
/// prototype or a definition; its list written out, or through an object-like macro.
pub fn declaration(
    rng: &mut StdRng,
    pre: &mut Preamble,
    name: &str,
    params: Option<&[GenParam]>,
    prototype: bool,
) -> String {
    let list = match params {
        Some(params) if rng.gen_ratio(1, 6) => {
            let list_macro = pre.name("PARAMS");
            let list = parameter_list(rng, params, MACRO_SEPARATORS);
            pre.lines.push(format!("#define {list_macro} {list}"));
            list_macro
        }
        Some(params) => parameter_list(rng, params, SEPARATORS),
        // A directive, or a function-like macro, inside the list.
        None if rng.gen() => "\n#ifdef CUFLOW_NEVER_DEFINED\nconst\n#endif\nfloat* x, int n".into(),
        None => {
            pre.lines.push("#define SAME(t) t".into());
            "SAME(const float)* x, int n".into()
        }
    };
    let head = head(rng, name, &list);
    if prototype {
        format!("{head};")
    } else {
        format!("{head} {BODY}")
    }
}

/// A kernel source with a random signature, and what the check knows of its parameters.
pub fn signature_source(rng: &mut StdRng, name: &str) -> (String, Vec<ParamModel>) {
    let mut pre = Preamble {
        through_macros: rng.gen_ratio(1, 6),
        ..Preamble::default()
    };
    let count = rng.gen_range(0..=8);
    let first: Vec<GenParam> = (0..count).map(|_| param(rng, &mut pre)).collect();
    // The kernel's other declarations: each its parameters (`None`: not readable).
    let mut others: Vec<Option<Vec<GenParam>>> = Vec::new();
    let mut first_declared = true;
    let mut kernel = String::new();
    match rng.gen_range(0..10) {
        0..=3 => {
            let d = declaration(rng, &mut pre, name, Some(&first), false);
            kernel.push_str(&d);
        }
        4 | 5 => {
            // A prototype, then the definition.
            let p = declaration(rng, &mut pre, name, Some(&first), true);
            let d = declaration(rng, &mut pre, name, Some(&first), false);
            let _ = write!(kernel, "{p}\n{d}");
            others.push(Some(first.clone()));
        }
        6..=8 => {
            // Branches of an `#if`, each parameter the same or another, now and then one
            // more or one fewer.
            let branches = rng.gen_range(1..=2);
            let _ = writeln!(kernel, "#if defined(CUFLOW_BRANCH) && CUFLOW_BRANCH > 1");
            let d = declaration(rng, &mut pre, name, Some(&first), false);
            let _ = writeln!(kernel, "{d}");
            for branch in 0..branches {
                let mut params: Vec<GenParam> = first
                    .iter()
                    .map(|p| {
                        if rng.gen() {
                            p.clone()
                        } else {
                            param(rng, &mut pre)
                        }
                    })
                    .collect();
                match rng.gen_range(0..8) {
                    0 => drop(params.pop()),
                    1 => params.push(param(rng, &mut pre)),
                    _ => {}
                }
                let _ = writeln!(
                    kernel,
                    "{}",
                    if branch + 1 == branches {
                        "#else"
                    } else {
                        "#elif CUFLOW_BRANCH == 1"
                    }
                );
                let d = declaration(rng, &mut pre, name, Some(&params), false);
                let _ = writeln!(kernel, "{d}");
                others.push(Some(params));
            }
            kernel.push_str("#endif");
        }
        _ => {
            // A declaration that cannot be read, alone or after a prototype.
            first_declared = rng.gen();
            if first_declared {
                let p = declaration(rng, &mut pre, name, Some(&first), true);
                let _ = writeln!(kernel, "{p}");
            }
            others.push(None);
            let d = declaration(rng, &mut pre, name, None, false);
            kernel.push_str(&d);
        }
    }
    let mut declarations: Vec<Option<Vec<ParamModel>>> = Vec::new();
    if first_declared {
        declarations.push(Some(first.iter().map(|p| p.model).collect()));
    }
    declarations.extend(
        others
            .iter()
            .map(|d| d.as_ref().map(|ps| ps.iter().map(|p| p.model).collect())),
    );
    let mut lines = pre.lines;
    let mut decoys: Vec<String> = (0..rng.gen_range(0..4))
        .map(|_| DECOYS[rng.gen_range(0..DECOYS.len())].replace("{K}", name))
        .collect();
    if pre.through_macros {
        decoys.push(DECLARING_MACRO.into());
    }
    for decoy in decoys {
        let at = rng.gen_range(0..=lines.len());
        lines.insert(at, decoy);
    }
    let mut source = lines.join("\n");
    source.push('\n');
    source.push_str(&kernel);
    source.push('\n');
    (source, merged(&declarations))
}
