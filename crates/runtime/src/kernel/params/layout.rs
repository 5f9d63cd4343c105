//! What the check against the source establishes about the memory the driver reads at a
//! launch: one pointer per parameter in the argument array, and behind each, as many bytes as
//! the parameter's size.
//!
//! A launch that passes [`check`](fn@super::check) against parameters whose number is known (the
//! declarations agree) and whose by-value parameters each have a size the check compares
//! (a plain type, a vector type, a type known through an alias or a struct of one plain type)
//! hands the driver exactly one argument per parameter, each in a slot of at least the
//! parameter's size. Where the source cannot say (no declaration is found, declarations
//! disagree or cannot be read, a struct or template type is passed by value), only the
//! driver's own account of the compiled function can; a backend whose driver gives none
//! refuses such a launch rather than let the driver read past the arguments.

use super::{Elem, Kind, Param};

/// What the check against the source establishes about a launch's arguments in memory (see
/// the [module](self)); computed once per compiled kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum SourceLayout {
    /// The number of parameters, and the size of every by-value parameter: an argument list
    /// that passes the check is one the driver reads within bounds.
    Established,
    /// No `__global__` declaration of the kernel was found in the source (a macro declares
    /// it): nothing is checked against the source.
    NotDeclared,
    /// The declarations disagree on the number of parameters or on pointer-vs-value, or one
    /// cannot be read: the number of arguments is not checked.
    Disputed,
    /// Parameter `index` (declared as `text`) is a value of a type whose size the check does
    /// not know (a struct, a template parameter, a type from a header).
    UnsizedValue { index: usize, text: String },
    /// Parameter `index` (declared as `text`) names a type alias the check cannot resolve
    /// (every launch is refused by the check already).
    Unresolved { index: usize, text: String },
}

impl SourceLayout {
    /// What the parameters read from the source (`None`: no declaration found) establish.
    pub(crate) fn of(params: Option<&[Param]>) -> SourceLayout {
        let Some(params) = params else {
            return SourceLayout::NotDeclared;
        };
        if params
            .iter()
            .any(|p| matches!(p.kind, Kind::Disputed { .. }))
        {
            return SourceLayout::Disputed;
        }
        for (index, p) in params.iter().enumerate() {
            let text = || p.text.clone();
            match p.kind {
                Kind::Unresolved => {
                    return SourceLayout::Unresolved {
                        index,
                        text: text(),
                    }
                }
                Kind::Value(Elem::Unknown) => {
                    return SourceLayout::UnsizedValue {
                        index,
                        text: text(),
                    }
                }
                // A pointer is 8 bytes, whatever it points to; the check compares the size of
                // a value of every other element kind.
                Kind::Value(Elem::Plain(_) | Elem::Sized(_) | Elem::Storage(_))
                | Kind::Pointer { .. }
                | Kind::Disputed { .. } => {}
            }
        }
        SourceLayout::Established
    }

    /// What the check against the source could not establish, for a message (`None` when it
    /// established everything), and the parameter it concerns.
    pub(crate) fn gap(&self) -> Option<(usize, String)> {
        Some(match self {
            SourceLayout::Established => return None,
            SourceLayout::NotDeclared => (
                0,
                "no `__global__` declaration of the kernel could be read from the source (a \
                 macro declares it, or spells its name), so neither the number of parameters \
                 nor their sizes are known"
                    .to_string(),
            ),
            SourceLayout::Disputed => (
                0,
                "the source declares the kernel more than once with different parameters (a \
                 prototype, preprocessor branches) or in a way that cannot be read (a \
                 directive or a function-like macro in its parameter list), so the number of \
                 parameters is not known"
                    .to_string(),
            ),
            SourceLayout::UnsizedValue { index, text } => (
                *index,
                format!(
                    "parameter `{text}` is passed by value, and the size of its type (a \
                     struct, a template parameter, a type from a header) is not known"
                ),
            ),
            SourceLayout::Unresolved { index, text } => (
                *index,
                format!(
                    "parameter `{text}` names a type alias that cannot be resolved to one \
                     type, so its size is not known"
                ),
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::parse;
    use super::*;

    fn layout(src: &str) -> SourceLayout {
        SourceLayout::of(parse(src, "k").as_deref())
    }

    #[test]
    fn a_plain_signature_establishes_the_layout() {
        for src in [
            "extern \"C\" __global__ void k(const float* x, double* y, unsigned n, float4 v) {}",
            "extern \"C\" __global__ void k(void) {}",
            // Pointers are 8 bytes whatever they point to.
            "template <class T> struct Box;\n\
             extern \"C\" __global__ void k(Box<float>* b, struct P* p, T* t) {}",
            // Sizes known through an alias, or a struct of one plain type.
            "typedef double real;\nstruct V { float x, y, z; };\ntypedef struct V V;\n\
             extern \"C\" __global__ void k(real r, V v, real* p) {}",
            // A prototype and a definition that agree.
            "extern \"C\" __global__ void k(float* x, int n);\n\
             extern \"C\" __global__ void k(float* x, int n) {}",
        ] {
            assert_eq!(layout(src), SourceLayout::Established, "{src}");
        }
    }

    #[test]
    fn a_signature_the_source_does_not_spell_out_leaves_the_layout_unknown() {
        assert_eq!(
            layout(
                "#define DECLARE(name) extern \"C\" __global__ void name(double* out, double v)\n\
                 DECLARE(k) {}"
            ),
            SourceLayout::NotDeclared
        );
        assert_eq!(
            layout(
                "extern \"C\" __global__ void k(const float* x, int n);\n\
                 extern \"C\" __global__ void k(const float* x, float* y, int n) {}"
            ),
            SourceLayout::Disputed
        );
        assert_eq!(
            layout("extern \"C\" __global__ void k(\n#if A\nconst\n#endif\nfloat* x) {}"),
            SourceLayout::Disputed
        );
        assert_eq!(
            layout("#define F(t) t\nextern \"C\" __global__ void k(F(const float)* x, int n) {}"),
            SourceLayout::Disputed
        );
    }

    #[test]
    fn a_value_of_a_type_of_unknown_size_leaves_the_layout_unknown() {
        let unsized_at = |src: &str| match layout(src) {
            SourceLayout::UnsizedValue { index, text } => Some((index, text)),
            _ => None,
        };
        assert_eq!(
            unsized_at(
                "struct M { float a; double b; };\n\
                 extern \"C\" __global__ void k(float* x, struct M m, unsigned n) {}"
            ),
            Some((1, "struct M m".to_string()))
        );
        assert_eq!(
            unsized_at("extern \"C\" __global__ void k(float* x, T value) {}"),
            Some((1, "T value".to_string()))
        );
        assert_eq!(
            unsized_at("extern \"C\" __global__ void k(Pair<float, int> p, float* x) {}"),
            Some((0, "Pair<float, int> p".to_string()))
        );
    }

    #[test]
    fn an_unresolved_alias_leaves_the_layout_unknown() {
        let src = "typedef float real;\ntypedef double real;\n\
                   extern \"C\" __global__ void k(float* x, real r) {}";
        assert!(matches!(
            layout(src),
            SourceLayout::Unresolved { index: 1, .. }
        ));
    }

    #[test]
    fn the_gap_names_what_could_not_be_checked() {
        assert_eq!(SourceLayout::Established.gap(), None);
        let (index, what) = SourceLayout::NotDeclared.gap().expect("a gap");
        assert_eq!(index, 0);
        assert!(what.contains("no `__global__` declaration"), "{what}");
        let (_, what) = SourceLayout::Disputed.gap().expect("a gap");
        assert!(what.contains("number of parameters"), "{what}");
        let (index, what) = SourceLayout::UnsizedValue {
            index: 2,
            text: "struct M m".into(),
        }
        .gap()
        .expect("a gap");
        assert_eq!(index, 2);
        assert!(what.contains("`struct M m`"), "{what}");
    }
}
