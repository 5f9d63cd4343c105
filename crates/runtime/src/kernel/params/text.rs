//! Reading C declarations: object-like macros, comments and literals, identifiers,
//! parentheses, top-level commas, and one parameter's type (see the [parent module](super);
//! type aliases are read in `alias`).
//!
//! Every scan here takes time in proportion to the text it is given, and the text a source's
//! macros expand to is bounded by a [`Budget`].

use std::cell::Cell;

use super::{Elem, Kind, Param};

/// Whether `c` may be part of an identifier. Characters outside ASCII are: compilers accept
/// them in identifiers (`données`), so `é` next to a name makes another name.
pub(super) fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || !c.is_ascii()
}

/// The bytes of text that expanding a source's macros, or resolving its type aliases, may
/// write: sixteen times the source, and a mebibyte. Text that grows past it (a macro that
/// names itself twice, macros or aliases each naming the one before several times) is left
/// unread, so that reading a source takes time in proportion to its length.
pub(super) struct Budget(Cell<usize>);

impl Budget {
    pub(super) fn for_source(source: &str) -> Budget {
        Budget(Cell::new(
            source.len().saturating_mul(16).saturating_add(1 << 20),
        ))
    }

    /// The bytes left.
    pub(super) fn left(&self) -> usize {
        self.0.get()
    }

    /// Takes `bytes` from the budget; `false`, and the budget spent, when it holds fewer.
    pub(super) fn spend(&self, bytes: usize) -> bool {
        let left = self.0.get().checked_sub(bytes);
        self.0.set(left.unwrap_or(0));
        left.is_some()
    }
}

/// The object-like macros a source `#define`s, for expansion in parameter lists.
pub(super) struct Macros<'s> {
    /// Each name with its body; `None` for a function-like macro, one defined twice with
    /// other bodies, or one `#undef`ined: a parameter list naming it cannot be read.
    defined: std::collections::HashMap<&'s str, Option<String>>,
    /// What expansions may still write (see [`Budget`]).
    budget: Budget,
}

impl<'s> Macros<'s> {
    pub(super) fn of(source: &'s str) -> Macros<'s> {
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
            let end = rest.find(|c: char| !is_ident_char(c)).unwrap_or(rest.len());
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
        Macros {
            defined,
            budget: Budget::for_source(source),
        }
    }

    /// `list` with its object-like macros expanded, or `None` when it names a macro that
    /// cannot be expanded so, or expands to more text than the [`Budget`] has left.
    pub(super) fn expand(&self, list: &str) -> Option<String> {
        let mut text = list.to_string();
        // Bounded: a macro that names itself stays unexpanded in C; here it is unreadable.
        for _ in 0..16 {
            let mut out = String::with_capacity(text.len());
            let mut changed = false;
            let mut rest = text.as_str();
            while let Some(c) = rest.chars().next() {
                if !is_ident_char(c) {
                    out.push(c);
                    rest = &rest[c.len_utf8()..];
                    continue;
                }
                let end = rest.find(|c: char| !is_ident_char(c)).unwrap_or(rest.len());
                let word = &rest[..end];
                rest = &rest[end..];
                // A number (`1e5`, `0x1Fu`) names no macro, whatever its letters.
                let body = if c.is_ascii_digit() {
                    None
                } else {
                    self.defined.get(word)
                };
                match body {
                    Some(Some(body)) => {
                        out.push(' ');
                        out.push_str(body);
                        out.push(' ');
                        changed = true;
                        if out.len() > self.budget.left() {
                            self.budget.spend(out.len());
                            return None;
                        }
                    }
                    Some(None) => return None,
                    None => out.push_str(word),
                }
            }
            if !changed {
                return Some(out);
            }
            if !self.budget.spend(out.len()) {
                return None;
            }
            text = out;
        }
        None
    }
}

/// `source` as the reader reads it: lines ended by a backslash joined to the next (as the
/// compiler joins them before anything else), comments replaced by a space, and string and
/// character literals emptied (`"__global__ void k(int)"` becomes `""`), so that nothing in
/// them reads as a declaration, a bracket, a comment or a directive.
pub(super) fn strip_comments_and_literals(source: &str) -> String {
    let spliced;
    let source = if source.contains('\\') {
        spliced = source.replace("\\\r\n", "").replace("\\\n", "");
        spliced.as_str()
    } else {
        source
    };
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(c) = rest.chars().next() {
        if let Some(r) = rest.strip_prefix("//") {
            rest = r.find('\n').map_or("", |i| &r[i..]);
        } else if let Some(r) = rest.strip_prefix("/*") {
            rest = r.find("*/").map_or("", |i| &r[i + 2..]);
            out.push(' ');
        } else if c == '"' {
            let prefix = trailing_identifier(&out);
            rest = match prefix.strip_suffix('R') {
                Some("" | "L" | "u" | "U" | "u8") => after_raw_string(&rest[1..]),
                _ => after_literal(&rest[1..], '"'),
            };
            out.push_str("\"\"");
        } else if c == '\'' && matches!(trailing_identifier(&out), "" | "L" | "u" | "U" | "u8") {
            // Not after a number: `1'000` separates digits.
            rest = after_literal(&rest[1..], '\'');
            out.push_str("''");
        } else {
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

/// The identifier `text` ends with (empty if none): the prefix of a literal that follows it
/// (`u8`, `L`, `R`), or the number a `'` separates digits of.
fn trailing_identifier(text: &str) -> &str {
    let start = text
        .char_indices()
        .rev()
        .take_while(|&(_, c)| is_ident_char(c))
        .last()
        .map_or(text.len(), |(i, _)| i);
    &text[start..]
}

/// `text` after the string or character literal it is inside of (its opening `quote` read
/// already): past the closing quote, or from the end of the line when it is not closed there.
fn after_literal(text: &str, quote: char) -> &str {
    let mut chars = text.char_indices();
    while let Some((i, c)) = chars.next() {
        if c == '\\' {
            chars.next();
        } else if c == '\n' {
            return &text[i..];
        } else if c == quote {
            return &text[i + 1..];
        }
    }
    ""
}

/// `text` after the raw string literal it is inside of (`R"` read already): past
/// `)DELIMITER"`. A raw string may span lines; one that is not closed runs to the end.
fn after_raw_string(text: &str) -> &str {
    // At most 16 characters before the `(`.
    let delimiter = text
        .char_indices()
        .take(17)
        .find(|&(_, c)| c == '(')
        .map(|(open, _)| &text[..open])
        .filter(|d| !d.contains([' ', ')', '\\', '\t', '\n', '"']));
    let Some(delimiter) = delimiter else {
        // Not a raw string's opening: read as an ordinary string.
        return after_literal(text, '"');
    };
    let body = &text[delimiter.len() + 1..];
    let mut from = 0;
    while let Some(at) = body[from..].find(')').map(|i| from + i) {
        let after = &body[at + 1..];
        if let Some(rest) = after
            .strip_prefix(delimiter)
            .and_then(|r| r.strip_prefix('"'))
        {
            return rest;
        }
        from = at + 1;
    }
    ""
}

/// The byte offset of `name` in `text` as a whole identifier.
pub(super) fn find_ident(text: &str, name: &str) -> Option<usize> {
    if name.is_empty() {
        return None;
    }
    let is_ident = is_ident_char;
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

/// The byte offset of the `)` that closes the `(` at `open`.
pub(super) fn matching_paren(text: &str, open: usize) -> Option<usize> {
    matching(text, open, '(', ')')
}

/// The byte offset of the `close` that closes the `open` bracket at `at`.
fn matching(text: &str, at: usize, open: char, close: char) -> Option<usize> {
    let mut depth = 0usize;
    for (i, c) in text.get(at..)?.char_indices() {
        if c == open {
            depth += 1;
        } else if c == close {
            depth = depth.checked_sub(1)?;
            if depth == 0 {
                return Some(at + i);
            }
        }
    }
    None
}

/// `param` without the attributes written in it (`[[maybe_unused]]`, `__attribute__((unused))`),
/// which say nothing of its type: each replaced by a space.
pub(super) fn without_attributes(param: &str) -> std::borrow::Cow<'_, str> {
    const GNU: &str = "__attribute__";
    if !param.contains("[[") && !param.contains(GNU) {
        return std::borrow::Cow::Borrowed(param);
    }
    let mut out = String::with_capacity(param.len());
    let mut rest = param;
    loop {
        // The first attribute of either kind, each text searched once.
        let standard = rest.find("[[");
        let gnu = find_ident(&rest[..standard.unwrap_or(rest.len())], GNU);
        let Some(at) = gnu.or(standard) else {
            break;
        };
        let attribute = &rest[at..];
        // `[[..]]` to the bracket that closes the first; `__attribute__ ((..))` to the
        // parenthesis that closes the first.
        let end = if gnu.is_none() {
            matching(attribute, 0, '[', ']')
        } else {
            let args = attribute[GNU.len()..].trim_start();
            let open = attribute.len() - args.len();
            args.starts_with('(')
                .then(|| matching_paren(attribute, open))
                .flatten()
        };
        let Some(end) = end else {
            break;
        };
        out.push_str(&rest[..at]);
        out.push(' ');
        rest = &attribute[end + 1..];
    }
    out.push_str(rest);
    std::borrow::Cow::Owned(out)
}

pub(super) fn split_top_level(list: &str) -> impl Iterator<Item = &str> {
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
        if is_ident_char(c) {
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

pub(super) fn parse_param(text: &str) -> Option<Param> {
    if text.is_empty() {
        return None;
    }
    let shown = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let param = |kind| {
        Some(Param {
            text: shown.clone(),
            kind,
            unresolved: None,
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
    // The levels of indirection outside template arguments and array sizes (`float x[N*M]`
    // has one level, an array): `*`s, then `[`s.
    let (mut depth, mut in_size) = (0i32, 0i32);
    let (mut stars, mut brackets) = (Vec::new(), Vec::new());
    for (i, c) in text.char_indices() {
        match c {
            '<' => depth += 1,
            '>' => depth -= 1,
            '*' if depth == 0 && in_size == 0 => stars.push(i),
            '[' => {
                if depth == 0 && in_size == 0 {
                    brackets.push(i);
                }
                in_size += 1;
            }
            ']' => in_size -= 1,
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
    // Empty where a `*` follows the array (not C): no qualifier is read from it.
    let writable = !has_outer_const(text.get(qualifiers_from..level).unwrap_or_default());
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
/// given, the parameter's name: the last word, unless it is a keyword that belongs to the type
/// (`unsigned short` has no name; `float half` names a float `half`, as a parameter's name
/// may hide a type's). Empty for a template.
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
    let keyword = |w: &str| {
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
        )
    };
    if named && words.len() > 1 && words.last().is_some_and(|w| !keyword(w)) {
        words.pop();
    }
    words
}
