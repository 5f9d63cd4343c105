//! Type aliases a kernel's source declares (`typedef double real;`, `using index_t =
//! unsigned;`, `typedef struct { float x, y, z; } Vec3;`), and the structs it defines with
//! fields of one plain type, resolved for the parameter check (see the [parent module](super)).
//!
//! The source is read once: each alias declaration is read where it stands (one inside
//! another's text, in a struct's body, is not visible outside it and is skipped), its end
//! found through [`DeclarationEnds`], and resolution writes no more than a [`Budget`] allows.

use super::text::{is_ident_char, matching_paren, split_top_level, Budget, Macros};
use super::{vector_size, Plain};

/// What a type alias (`typedef T NAME;`, `using NAME = T;`) the source declares stands for.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Alias {
    /// A type written without `*` outside template arguments (`double`, `const float`,
    /// `Vec<float>`): its text replaces the alias's name.
    Object(String),
    /// A pointer type (`float*`): its text replaces the alias's name, and a `const` or
    /// `volatile` written before the name qualifies the pointer, so it moves after the text
    /// (`const fptr x` is `float* const x`).
    Pointer(String),
    /// A struct, union or enum (`typedef struct { .. } P;`, `typedef struct P P;`): checked
    /// as such types are, by kind.
    Opaque,
    /// A struct whose fields are all of one plain C type (`struct Vec3 { float x, y, z; }`):
    /// no padding, so its size is known (here, in bytes), and it is checked as elements of
    /// that size.
    Struct(u32),
    /// One the check cannot read as a type (an array, a function or a reference type, an
    /// alias template, a declaration naming several types), or declared more than once with
    /// other types (the branches of an `#if`): a parameter naming it is refused.
    Unresolvable,
}

/// The type aliases a source declares, for resolution in parameter lists.
pub(super) struct Aliases {
    defined: std::collections::HashMap<String, Alias>,
    /// Whether a function-like macro declares aliases (`#define DECLARE(T, N) typedef T N;`):
    /// the names its uses declare cannot be read without running the preprocessor, so a
    /// parameter's type name the source does not declare may be one of them.
    through_macros: bool,
    /// What resolution may still write (see [`Budget`]).
    budget: Budget,
}

/// The byte ranges of the bodies of the function-like macros `source` defines.
fn function_like_macro_bodies(source: &str) -> Vec<std::ops::Range<usize>> {
    let mut bodies = Vec::new();
    let mut offset = 0;
    let mut open: Option<usize> = None;
    for line in source.split_inclusive('\n') {
        let start = offset;
        offset += line.len();
        if let Some(from) = open {
            if !line.trim_end().ends_with('\\') {
                bodies.push(from..offset);
                open = None;
            }
            continue;
        }
        let Some(directive) = line.trim_start().strip_prefix('#') else {
            continue;
        };
        let Some(rest) = directive.trim_start().strip_prefix("define") else {
            continue;
        };
        let name = rest.trim_start();
        let end = name.find(|c: char| !is_ident_char(c)).unwrap_or(name.len());
        if end == 0 || !rest.starts_with([' ', '\t']) || !name[end..].starts_with('(') {
            continue;
        }
        if line.trim_end().ends_with('\\') {
            open = Some(start);
        } else {
            bodies.push(start..offset);
        }
    }
    if let Some(from) = open {
        bodies.push(from..source.len());
    }
    bodies
}

/// Whether `word` is one of C's type keywords or qualifiers, or a type the check knows by name.
fn is_known_type_word(word: &str) -> bool {
    names_no_type(word)
        || matches!(
            word,
            "unsigned"
                | "signed"
                | "short"
                | "long"
                | "int"
                | "char"
                | "float"
                | "double"
                | "bool"
                | "void"
        )
        || Plain::of_c(&[word]).is_some()
        || vector_size(word).is_some()
        || storage_size(word).is_some()
}

/// The word that stands for a struct of known size in a resolved parameter, followed by the
/// size in bytes; read back by [`storage_size`].
const STORAGE_PREFIX: &str = "__cuflow_storage_";

/// The size in bytes that a word made with [`STORAGE_PREFIX`] stands for.
pub(super) fn storage_size(word: &str) -> Option<u32> {
    word.strip_prefix(STORAGE_PREFIX)?.parse().ok()
}

/// The size of the struct `name` whose definition `after` (the text just after its `struct`
/// keyword) opens, when nothing but its name stands before its body (no base, no alignment
/// attribute) and its fields are all of one plain type.
fn defined_struct_size(after: &str, name: &str) -> Option<u32> {
    let rest = after.trim_start().strip_prefix(name)?;
    let body = rest.trim_start().strip_prefix('{')?;
    // Fields of one plain type hold no braces: the body ends at the first one.
    let close = body.find(['{', '}'])?;
    if !body[close..].starts_with('}') {
        return None;
    }
    uniform_struct_size(&body[..close])
}

/// The size of a struct with the fields `body` when every field is of one plain C type
/// (`float x, y, z;`, `double v[2];`): then it has no padding. `None` for anything else
/// (another type, a pointer, a bit-field, a member function, a nested type, an attribute).
fn uniform_struct_size(body: &str) -> Option<u32> {
    let mut plain: Option<Plain> = None;
    let mut count = 0usize;
    for field in body.split(';').map(str::trim).filter(|f| !f.is_empty()) {
        if field.contains(['(', ')', '{', '}', ':', '<', '*', '&', '=', '#']) {
            return None;
        }
        let mut declarators = field.split(',');
        let first = declarators.next()?;
        // The first declarator holds the type: every word before its name.
        let head = first.split('[').next()?;
        let words: Vec<&str> = head.split_whitespace().collect();
        let (name, ty) = words.split_last()?;
        if ty
            .iter()
            .any(|w| matches!(*w, "static" | "typedef" | "using"))
        {
            return None;
        }
        let ty: Vec<&str> = ty
            .iter()
            .copied()
            .filter(|w| !matches!(*w, "const" | "volatile"))
            .collect();
        let p = Plain::of_c(&ty)?;
        if plain.is_some_and(|q| q != p) {
            return None;
        }
        plain = Some(p);
        let first_name = format!("{name}{}", &first[head.len()..]);
        for declarator in std::iter::once(first_name.as_str()).chain(declarators) {
            count = count.checked_add(elements(declarator.trim())?)?;
        }
    }
    let bytes = count.checked_mul(plain?.size())?;
    u32::try_from(bytes).ok().filter(|b| *b > 0)
}

/// The number of elements a field declarator (`x`, `v[3]`, `m[2][2]`) holds.
fn elements(declarator: &str) -> Option<usize> {
    let mut parts = declarator.split('[');
    let name = parts.next()?.trim();
    if name.is_empty() || !name.chars().all(is_ident_char) {
        return None;
    }
    parts.try_fold(1usize, |n, dim| {
        let dim: usize = dim.strip_suffix(']')?.trim().parse().ok()?;
        n.checked_mul(dim)
    })
}

/// The identifiers of `text`, each with its byte offset.
fn identifiers(text: &str) -> Vec<(usize, &str)> {
    let mut found = Vec::new();
    let mut start = None;
    for (i, c) in text.char_indices().chain([(text.len(), ' ')]) {
        if is_ident_char(c) {
            if start.is_none() && !c.is_ascii_digit() {
                start = Some(i);
            } else if start.is_none() {
                // A number: skipped to its end.
                start = Some(usize::MAX);
            }
            continue;
        }
        if let Some(s) = start.take() {
            if s != usize::MAX {
                found.push((s, &text[s..i]));
            }
        }
    }
    found
}

/// Where the declarations of a source end: for a declaration starting at any offset, the `;`
/// that ends it outside the braces and parentheses it opens. Found for every offset at once,
/// so that declarations that never end (`typedef typedef ..`) take no longer to read than
/// those that do.
struct DeclarationEnds {
    /// The offsets of the `;`, `{`, `(`, `}` and `)` of the source, in order.
    marks: Vec<usize>,
    /// For each mark, the offset of the `;` that ends a declaration starting there: `None`
    /// where a bracket closes the scope around it first, or the source ends first.
    ends: Vec<Option<usize>>,
}

impl DeclarationEnds {
    fn of(source: &str) -> DeclarationEnds {
        let marks: Vec<(usize, u8)> = source
            .bytes()
            .enumerate()
            .filter(|(_, b)| matches!(b, b';' | b'{' | b'(' | b'}' | b')'))
            .collect();
        // The mark that closes each opening one.
        let mut closing = vec![None; marks.len()];
        let mut open = Vec::new();
        for (j, &(_, b)) in marks.iter().enumerate() {
            match b {
                b'{' | b'(' => open.push(j),
                b'}' | b')' => {
                    if let Some(o) = open.pop() {
                        closing[o] = Some(j);
                    }
                }
                _ => {}
            }
        }
        // From the last mark back: a `;` ends a declaration, a bracket that closes first ends
        // none, and one that opens is passed over to the mark after the one that closes it.
        let mut ends = vec![None; marks.len()];
        for j in (0..marks.len()).rev() {
            ends[j] = match marks[j].1 {
                b';' => Some(marks[j].0),
                b'{' | b'(' => closing[j].and_then(|c| ends.get(c + 1).copied().flatten()),
                _ => None,
            };
        }
        DeclarationEnds {
            marks: marks.into_iter().map(|(at, _)| at).collect(),
            ends,
        }
    }

    /// The offset of the `;` that ends the declaration starting at `from`.
    fn after(&self, from: usize) -> Option<usize> {
        let first = self.marks.partition_point(|&at| at < from);
        self.ends.get(first).copied().flatten()
    }
}

/// Words that qualify or elaborate a type without naming it: a parameter's last identifier is
/// its name only where a word before it, not one of these, names its type (`const real` and
/// `__grid_constant__ const real` have no name, `const real x` has).
fn names_no_type(word: &str) -> bool {
    matches!(
        word,
        "const"
            | "volatile"
            | "__restrict__"
            | "__restrict"
            | "restrict"
            | "__grid_constant__"
            | "struct"
            | "class"
            | "union"
            | "enum"
            | "typename"
    )
}

impl Aliases {
    pub(super) fn of(source: &str, macros: &Macros<'_>) -> Aliases {
        let mut aliases = Aliases {
            defined: std::collections::HashMap::new(),
            through_macros: false,
            budget: Budget::for_source(source),
        };
        let in_macros = function_like_macro_bodies(source);
        let mut next_macro = 0;
        let ends = DeclarationEnds::of(source);
        let words = identifiers(source);
        // For each word, the first at or after it that is not `class`, `struct` or
        // `__align__`: the name a `struct` keyword before it declares.
        let mut named_from = vec![words.len(); words.len() + 1];
        for i in (0..words.len()).rev() {
            named_from[i] = if matches!(words[i].1, "class" | "struct" | "__align__") {
                named_from[i + 1]
            } else {
                i
            };
        }
        // The end of the last alias declaration read.
        let mut read_until = 0;
        for (i, &(at, word)) in words.iter().enumerate() {
            let after = at + word.len();
            // The macro bodies are in order, and so are the words.
            while in_macros.get(next_macro).is_some_and(|body| body.end <= at) {
                next_macro += 1;
            }
            let in_macro = in_macros
                .get(next_macro)
                .is_some_and(|body| body.contains(&at));
            match word {
                "typedef" | "using" if in_macro => aliases.through_macros = true,
                "typedef" | "using" if at < read_until => {}
                "typedef" => {
                    if let Some(end) = ends.after(after) {
                        aliases.read_typedef(&source[after..end], macros);
                        read_until = end;
                    }
                }
                "using" => {
                    if let Some(end) =
                        aliases.read_using(source, at, &words[i + 1..], &ends, macros)
                    {
                        read_until = end;
                    }
                }
                // `struct P`, `enum class E`: a type the source declares, checked by kind (not
                // `template <class T>`'s parameter).
                "struct" | "class" | "union" | "enum"
                    if !source[..at].trim_end().ends_with(['<', ',']) =>
                {
                    let named = words.get(named_from[i + 1]).map(|(_, w)| *w);
                    if let Some(name) = named.filter(|w| !is_known_type_word(w)) {
                        let alias = if word == "struct" {
                            defined_struct_size(&source[after..], name)
                                .map_or(Alias::Opaque, Alias::Struct)
                        } else {
                            Alias::Opaque
                        };
                        aliases.declare(name, alias);
                    }
                }
                _ => {}
            }
        }
        aliases
    }

    /// Declares `name`; declared again as something else, it is unresolvable, except that a
    /// struct's definition says more than its other mentions (`struct P;`, `typedef struct
    /// P P;`).
    fn declare(&mut self, name: &str, alias: Alias) {
        self.defined
            .entry(name.to_string())
            .and_modify(|a| {
                *a = match (&*a, &alias) {
                    (x, y) if x == y => alias.clone(),
                    (Alias::Opaque, Alias::Struct(_)) => alias.clone(),
                    (Alias::Struct(_), Alias::Opaque) => a.clone(),
                    _ => Alias::Unresolvable,
                };
            })
            .or_insert(alias);
    }

    /// `typedef TYPE NAME;`: `text` runs from just after `typedef` to the `;`.
    fn read_typedef(&mut self, text: &str, macros: &Macros<'_>) {
        if let Some(close) = text.rfind('}') {
            // `typedef struct { .. } NAME, *PNAME;`: the plain names are the struct.
            for declarator in text[close + 1..].split(',') {
                let names = identifiers(declarator);
                let Some((_, name)) = names.last() else {
                    continue;
                };
                let plain = declarator.trim() == *name;
                // `typedef struct [TAG] { .. } NAME;`, nothing else before the body.
                let size = text[..close].find('{').and_then(|open| {
                    let head: Vec<&str> = text[..open].split_whitespace().collect();
                    matches!(head.as_slice(), ["struct"] | ["struct", _])
                        .then(|| uniform_struct_size(&text[open + 1..close]))
                        .flatten()
                });
                self.declare(
                    name,
                    match (plain, size) {
                        (true, Some(bytes)) => Alias::Struct(bytes),
                        (true, None) => Alias::Opaque,
                        (false, _) => Alias::Unresolvable,
                    },
                );
            }
            return;
        }
        let parts: Vec<&str> = split_top_level(text).collect();
        if parts.len() > 1 || text.contains(['(', '[', '&']) {
            // Several declarators, or a function, array or reference type: the names are
            // known, not what they stand for. A function type's name is the last identifier
            // in its first parentheses.
            for part in parts {
                let named = part
                    .find('(')
                    .and_then(|open| {
                        let close = matching_paren(part, open)?;
                        Some(&part[open + 1..close])
                    })
                    .filter(|inner| !identifiers(inner).is_empty())
                    .unwrap_or_else(|| part.split('[').next().unwrap_or(part));
                if let Some((_, name)) = identifiers(named).last() {
                    self.declare(name, Alias::Unresolvable);
                }
            }
            return;
        }
        let names = identifiers(text);
        let Some(&(at, name)) = names.last() else {
            return;
        };
        let alias = self.alias_of(name, &text[..at], macros);
        self.declare(name, alias);
    }

    /// `using NAME = TYPE;` from the `using` at `at`, followed by the words `next`; a `using
    /// namespace` or `using A::b` declares nothing. The offset of its `;` if it declares one.
    fn read_using(
        &mut self,
        source: &str,
        at: usize,
        next: &[(usize, &str)],
        ends: &DeclarationEnds,
        macros: &Macros<'_>,
    ) -> Option<usize> {
        let &(name_at, name) = next.first()?;
        if !source[at + "using".len()..name_at].trim().is_empty() || name == "namespace" {
            return None;
        }
        let body = source[name_at + name.len()..]
            .trim_start()
            .strip_prefix('=')?;
        let body_from = source.len() - body.len();
        let end = ends.after(body_from)?;
        let template = source[..at].trim_end().ends_with('>');
        let alias = if template || source[body_from..end].contains(['(', '[', '&', '{']) {
            Alias::Unresolvable
        } else {
            self.alias_of(name, &source[body_from..end], macros)
        };
        self.declare(name, alias);
        Some(end)
    }

    /// What the type written `body` makes the alias `name`.
    fn alias_of(&self, name: &str, body: &str, macros: &Macros<'_>) -> Alias {
        let Some(body) = macros.expand(body) else {
            return Alias::Unresolvable;
        };
        let words: Vec<&str> = identifiers(&body)
            .into_iter()
            .map(|(_, w)| w)
            .filter(|w| !matches!(*w, "struct" | "class" | "union" | "enum" | "typename"))
            .collect();
        if words.is_empty() {
            return Alias::Unresolvable;
        }
        if words == [name] {
            // `typedef struct P P;`
            return Alias::Opaque;
        }
        let body = words_outside_elaboration(&body);
        let mut depth = 0i32;
        let pointer = body.chars().any(|c| {
            match c {
                '<' => depth += 1,
                '>' => depth -= 1,
                _ => {}
            }
            c == '*' && depth == 0
        });
        if pointer {
            Alias::Pointer(body)
        } else {
            Alias::Object(body)
        }
    }

    /// The parameter `param` with the aliases it names replaced by the types they stand for,
    /// or `Err(name)` naming one that cannot be resolved (or whose text grows past the
    /// [`Budget`]). Its last identifier is its name where another word before it, not a
    /// qualifier, names its type; with parentheses, its type is what stands before them.
    pub(super) fn resolve(&self, param: &str) -> std::result::Result<String, String> {
        if self.defined.is_empty() && !self.through_macros {
            return Ok(param.to_string());
        }
        let first_alias = || {
            identifiers(param)
                .into_iter()
                .map(|(_, w)| w)
                .find(|w| self.defined.contains_key(*w))
                .unwrap_or(param)
                .to_string()
        };
        let mut text = param.to_string();
        // Bounded: an alias that names itself through others is unresolvable.
        for _ in 0..16 {
            let words = identifiers(&text);
            let named = words.len() >= 2
                && words[..words.len() - 1]
                    .iter()
                    .any(|(_, w)| !names_no_type(w));
            let typed = match text.find('(') {
                // `RET (*name)(ARGS)`, `T (name)`: the type is what stands before the
                // parenthesis; the name, and a function's parameters, are inside.
                Some(open) => {
                    let before = words.iter().take_while(|(at, _)| *at < open).count();
                    &words[..before]
                }
                None if named => &words[..words.len() - 1],
                None => &words[..],
            };
            let mut out = String::with_capacity(text.len());
            let mut copied = 0;
            let mut changed = false;
            for &(at, word) in typed {
                if out.len() > self.budget.left() {
                    self.budget.spend(out.len());
                    return Err(word.to_string());
                }
                let alias = match self.defined.get(word) {
                    None if self.through_macros && !is_known_type_word(word) => {
                        return Err(word.to_string())
                    }
                    None | Some(Alias::Opaque) => continue,
                    Some(Alias::Struct(bytes)) => {
                        // A name the parameter's reader knows by size.
                        out.push_str(&text[copied..at]);
                        copied = at + word.len();
                        out.push_str(&format!(" {STORAGE_PREFIX}{bytes} "));
                        changed = true;
                        continue;
                    }
                    Some(Alias::Unresolvable) => return Err(word.to_string()),
                    Some(a) => a,
                };
                out.push_str(&text[copied..at]);
                copied = at + word.len();
                changed = true;
                match alias {
                    Alias::Object(body) => {
                        out.push(' ');
                        out.push_str(body);
                        out.push(' ');
                    }
                    Alias::Pointer(body) => {
                        // The qualifiers written since the last declarator level move after
                        // the pointer they qualify.
                        let level = out.rfind(['*', '(', '<', ',']).map_or(0, |i| i + 1);
                        let before = out.split_off(level);
                        let mut qualifiers = String::new();
                        for piece in before.split_inclusive(|c: char| !is_ident_char(c)) {
                            let word = piece.trim_end_matches(|c: char| !is_ident_char(c));
                            if matches!(word, "const" | "volatile") {
                                qualifiers.push(' ');
                                qualifiers.push_str(word);
                                out.push_str(&piece[word.len()..]);
                            } else {
                                out.push_str(piece);
                            }
                        }
                        out.push(' ');
                        out.push_str(body);
                        out.push_str(&qualifiers);
                        out.push(' ');
                    }
                    Alias::Opaque | Alias::Struct(_) | Alias::Unresolvable => {}
                }
            }
            if !changed {
                return Ok(text);
            }
            out.push_str(&text[copied..]);
            if !self.budget.spend(out.len()) {
                return Err(first_alias());
            }
            text = out;
        }
        Err(first_alias())
    }
}

/// `body` without the words `struct`, `class`, `union`, `enum` and `typename`, whose types
/// the check reads by the name that follows.
fn words_outside_elaboration(body: &str) -> String {
    body.split_whitespace()
        .filter(|w| !matches!(*w, "struct" | "class" | "union" | "enum" | "typename"))
        .collect::<Vec<_>>()
        .join(" ")
}
