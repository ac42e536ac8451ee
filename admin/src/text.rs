//! Text for the admin page and API: HTML escaping, hex, and keys shown as text.

use std::fmt::Write;

/// The key separator of tuple extractors, shown as the Unicode symbol for it so that a key
/// read off the page can be typed back into the lookup form.
const SEPARATOR_SYMBOL: char = '\u{241F}';

/// `text` with `&`, `<`, `>`, `"` and `'` escaped: safe in an element or a quoted attribute.
pub(crate) fn html(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Lower-case hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// The bytes `text` spells in hex, if it does.
pub(crate) fn unhex(text: &str) -> Option<Vec<u8>> {
    let text = text.as_bytes();
    if !text.len().is_multiple_of(2) {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    text.chunks(2)
        .map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect()
}

/// A key as a person reads it: its text, with the parts of a tuple key separated by `␟`,
/// control characters as `\u{…}` and bytes that are not UTF-8 as `\x…`; a key the store
/// keeps as a digest as `sha256:` and the digest's hex.
pub(crate) fn key_text(bytes: &[u8], digested: bool) -> String {
    if digested {
        return format!("sha256:{}", hex(bytes.get(1..).unwrap_or_default()));
    }
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\u{1F}' => out.push(SEPARATOR_SYMBOL),
                c if c.is_control() => {
                    let _ = write!(out, "\\u{{{:x}}}", c as u32);
                }
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    out
}

/// The key typed into the lookup form: its UTF-8 bytes, `␟` standing for the separator.
pub(crate) fn typed_key(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    for c in text.chars() {
        if c == SEPARATOR_SYMBOL {
            out.push(0x1F);
        } else {
            let mut buf = [0; 4];
            out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Markup in a key is escaped, bytes that are not text are shown as hex escapes, and a
    /// tuple key typed back as shown is the same key.
    #[test]
    fn keys_are_shown_safely_and_typed_back() {
        assert_eq!(html("<b a='x'>&\""), "&lt;b a=&#39;x&#39;&gt;&amp;&quot;");
        assert_eq!(key_text(b"a\xffb\n", false), "a\\xffb\\u{a}");
        let tuple = b"203.0.113.7\x1falice";
        let shown = key_text(tuple, false);
        assert_eq!(shown, "203.0.113.7\u{241F}alice");
        assert_eq!(typed_key(&shown), tuple);
        assert_eq!(unhex(&hex(b"\x00\xfe")).as_deref(), Some(&b"\x00\xfe"[..]));
        assert_eq!(unhex("zz"), None);
        let digest = [0xFF; 33];
        assert!(key_text(&digest, true).starts_with("sha256:ffff"));
    }
}
