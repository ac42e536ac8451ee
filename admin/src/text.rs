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

/// A key as a person reads it: its text, with the parts of a tuple key separated by `␟`;
/// control characters, characters that show nothing or reorder text (zero-width, bidi
/// controls, whitespace other than the space, variation selectors, tags) as `\u{…}`, and a
/// `\` or a literal `␟` escaped too, so that no key can pass for another on the page; bytes
/// that are not UTF-8 as `\x…`; a key the store keeps as a digest as `sha256:` and the
/// digest's hex, and a key spelled so itself with its colon escaped (`sha256\u{3a}…`), so
/// that it never passes for a digest. [`typed_key`] reads it back.
pub(crate) fn key_text(bytes: &[u8], digested: bool) -> String {
    if digested {
        return format!("{DIGEST_PREFIX}{}", hex(bytes.get(1..).unwrap_or_default()));
    }
    let mut out = String::with_capacity(bytes.len());
    let bytes = match bytes.strip_prefix(DIGEST_PREFIX.as_bytes()) {
        Some(rest) => {
            out.push_str("sha256\\u{3a}");
            rest
        }
        None => bytes,
    };
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\u{1F}' => out.push(SEPARATOR_SYMBOL),
                '\\' => out.push_str("\\\\"),
                c if c == SEPARATOR_SYMBOL || hidden(c) => {
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

/// How the page shows a key the store keeps as a digest, before the digest's hex.
const DIGEST_PREFIX: &str = "sha256:";

/// Whether `c` could make one key look like another: it shows nothing (Unicode's default
/// ignorable code points and format characters, blank fillers), shows as a space other
/// than the space, reorders the text around it, or shows as the same box as others of its
/// kind (private use).
fn hidden(c: char) -> bool {
    c.is_control()
        || (c.is_whitespace() && c != ' ')
        || matches!(c,
            '\u{00AD}' | '\u{034F}' | '\u{0600}'..='\u{0605}' | '\u{061C}' | '\u{06DD}'
            | '\u{070F}' | '\u{0890}'..='\u{0891}' | '\u{08E2}' | '\u{115F}' | '\u{1160}'
            | '\u{17B4}' | '\u{17B5}' | '\u{180B}'..='\u{180F}' | '\u{200B}'..='\u{200F}'
            | '\u{202A}'..='\u{202E}' | '\u{2060}'..='\u{206F}' | '\u{2800}' | '\u{3164}'
            | '\u{E000}'..='\u{F8FF}' | '\u{FE00}'..='\u{FE0F}' | '\u{FEFF}' | '\u{FFA0}'
            | '\u{FFF0}'..='\u{FFFB}' | '\u{110BD}' | '\u{110CD}' | '\u{13430}'..='\u{1343F}'
            | '\u{16FE4}' | '\u{1BCA0}'..='\u{1BCA3}' | '\u{1D159}' | '\u{1D173}'..='\u{1D17A}'
            | '\u{E0000}'..='\u{E0FFF}' | '\u{F0000}'..='\u{10FFFF}')
}

/// The digest a lookup's text names, as the page shows digests (`sha256:` and 64 hex
/// digits): the 33 bytes the store keeps it under. A key spelled so itself is shown, and
/// typed, with its colon escaped.
pub(crate) fn typed_digest(text: &str) -> Option<Vec<u8>> {
    let digest = unhex(text.strip_prefix(DIGEST_PREFIX)?).filter(|d| d.len() == 32)?;
    Some([&[0xFF][..], &digest].concat())
}

/// A key's text (from [`key_text`]) as HTML: escaped, each part of a tuple key in a box of
/// its own, so that the parts read as parts.
pub(crate) fn key_html(text: &str) -> String {
    let parts: Vec<String> = text
        .split(SEPARATOR_SYMBOL)
        .map(|part| format!("<span class=\"part\">{}</span>", html(part)))
        .collect();
    parts.join(&format!("<span class=\"sep\">{SEPARATOR_SYMBOL}</span>"))
}

/// The key typed into the lookup form, as [`key_text`] shows it: `␟` standing for the
/// separator, and its escapes (`\\`, `\u{…}`, `\x…`) read back; anything else as typed.
pub(crate) fn typed_key(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        rest = &rest[c.len_utf8()..];
        if c == SEPARATOR_SYMBOL {
            out.push(0x1F);
            continue;
        }
        if c == '\\' {
            if let Some(after) = rest.strip_prefix('\\') {
                out.push(b'\\');
                rest = after;
                continue;
            }
            if let Some(escaped) = rest.strip_prefix("u{").and_then(|r| r.split_once('}')) {
                let code = u32::from_str_radix(escaped.0, 16)
                    .ok()
                    .and_then(char::from_u32);
                if let Some(code) = code {
                    let mut buf = [0; 4];
                    out.extend_from_slice(code.encode_utf8(&mut buf).as_bytes());
                    rest = escaped.1;
                    continue;
                }
            }
            if let Some(byte) = rest.get(1..3).filter(|_| rest.starts_with('x')) {
                if let Ok(byte) = u8::from_str_radix(byte, 16) {
                    out.push(byte);
                    rest = &rest[3..];
                    continue;
                }
            }
        }
        let mut buf = [0; 4];
        out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
    }
    out
}

/// A wait as a person reads it: tenths of a second under a minute, then minutes and
/// seconds, then hours and minutes.
pub(crate) fn wait_text(ms: u128) -> String {
    let secs = ms / 1000;
    match secs {
        0..60 => format!("{:.1} s", ms as f64 / 1000.0),
        60..3600 => format!("{} min {} s", secs / 60, secs % 60),
        _ => format!("{} h {} min", secs / 3600, secs % 3600 / 60),
    }
}

/// The time of day (UTC) of an instant given in milliseconds since the Unix epoch: what a
/// lock's end reads as on the page (the operator's clock may be in any zone; UTC is said).
pub(crate) fn clock_time(unix_ms: u128) -> String {
    let secs = unix_ms / 1000;
    let day = secs % 86_400;
    format!(
        "{:02}:{:02}:{:02} UTC",
        day / 3600,
        day % 3600 / 60,
        day % 60
    )
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

    /// Waits and times of day read as a person reads them.
    #[test]
    fn waits_and_times_read_plainly() {
        assert_eq!(wait_text(1_250), "1.2 s");
        assert_eq!(wait_text(899_000), "14 min 59 s");
        assert_eq!(wait_text(7_260_000), "2 h 1 min");
        assert_eq!(clock_time(1_700_000_000_000), "22:13:20 UTC");
    }

    /// Keys that would look alike on the page do not: invisible and reordering characters,
    /// a backslash and a literal `␟` are escaped, every shown key is typed back to its
    /// bytes, and the parts of a tuple key are shown as parts.
    #[test]
    fn no_key_passes_for_another() {
        let keys: [&[u8]; 7] = [
            b"alice",
            "al\u{200b}ice".as_bytes(),
            "ali\u{202e}ecila".as_bytes(),
            "alice\u{a0}".as_bytes(),
            br"al\u{200b}ice",
            "a\u{241f}b".as_bytes(),
            b"a\x1fb",
        ];
        let shown: Vec<String> = keys.iter().map(|k| key_text(k, false)).collect();
        for (key, text) in keys.iter().zip(&shown) {
            assert!(!text.chars().any(hidden), "{text:?} hides a character");
            assert_eq!(typed_key(text), *key, "{text:?}");
        }
        for (i, a) in shown.iter().enumerate() {
            assert!(!shown[i + 1..].contains(a), "{a:?} shown twice");
        }
        assert_eq!(shown[1], r"al\u{200b}ice");
        assert_eq!(shown[4], r"al\\u{200b}ice");
        assert_eq!(shown[5], r"a\u{241f}b");
        assert_eq!(shown[6], "a\u{241F}b");
        assert_eq!(
            key_html("203.0.113.7\u{241F}<b>"),
            "<span class=\"part\">203.0.113.7</span><span class=\"sep\">\u{241F}</span><span class=\"part\">&lt;b&gt;</span>"
        );
    }

    /// Characters that show nothing are escaped, and a raw key spelled as a digest is shown
    /// apart from the digest, and each is typed back to itself.
    #[test]
    fn invisible_characters_and_digest_look_alikes_are_told_apart() {
        for c in [
            '\u{1D173}',
            '\u{1D17A}',
            '\u{1BCA0}',
            '\u{1BCA3}',
            '\u{E000}',
        ] {
            let key = format!("al{c}ice");
            let shown = key_text(key.as_bytes(), false);
            assert_eq!(shown, format!("al\\u{{{:x}}}ice", c as u32));
            assert_eq!(typed_key(&shown), key.as_bytes());
        }
        let digest = [[0xFF].as_slice(), &[0xAB; 32]].concat();
        let digest_text = key_text(&digest, true);
        let look_alike = format!("sha256:{}", "ab".repeat(32));
        let raw_text = key_text(look_alike.as_bytes(), false);
        assert_ne!(raw_text, digest_text);
        assert_eq!(typed_key(&raw_text), look_alike.as_bytes());
        assert_eq!(typed_digest(&digest_text), Some(digest));
        assert_eq!(typed_digest(&raw_text), None);
    }
}
