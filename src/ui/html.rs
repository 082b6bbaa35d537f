//! HTML for `smithfs ui`: escaping (every byte a smith wrote — task names, results, logs, paths —
//! goes through [`esc`] or [`log_text`] before it reaches a page), a log's bytes made safe to
//! show (invalid UTF-8 replaced, terminal escapes and other control characters shown as visible
//! symbols, never interpreted), a diff rendered line by line, and the page shell.

use std::fmt::Write as _;

/// `s` escaped for HTML text and double-quoted attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
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

/// A control character as a visible symbol: C0 as its Control Pictures sign (ESC as `␛`),
/// DEL as `␡`, C1 as `�`. Newline and tab are kept.
fn visible(c: char) -> Option<char> {
    match c {
        '\n' | '\t' => None,
        c if (c as u32) < 0x20 => char::from_u32(0x2400 + c as u32),
        '\u{7f}' => Some('\u{2421}'),
        c if ('\u{80}'..='\u{9f}').contains(&c) => Some('\u{fffd}'),
        _ => None,
    }
}

/// Is `c` a bidirectional formatting character: an embedding, override or isolate, their end,
/// or an invisible direction mark? In a smith's text they reorder what the operator sees
/// ("Trojan Source", CVE-2021-42574): code that reads as a comment runs, a string that reads
/// as closed is not (notes UI12).
pub fn is_bidi_control(c: char) -> bool {
    matches!(
        c,
        '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
    )
}

/// A log's bytes as text that is safe on a page: invalid UTF-8 replaced (U+FFFD), control
/// characters made visible ([`visible`]: `ESC [ 3 1 m` shows as `␛[31m`), bidirectional
/// formatting characters shown by their code (`⟨U+202E⟩`) instead of reordering the line
/// ([`is_bidi_control`]), then escaped.
pub fn log_text(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut shown = String::with_capacity(text.len());
    for c in text.chars() {
        if is_bidi_control(c) {
            let _ = write!(shown, "\u{27e8}U+{:04X}\u{27e9}", c as u32);
        } else {
            shown.push(visible(c).unwrap_or(c));
        }
    }
    esc(&shown)
}

/// `git diff` output rendered line by line, each line escaped in a span classed by its kind
/// (`add`, `del`, `hunk`, `meta`), inside a `<pre class="diff">`; at most `max_lines` lines
/// (true: some were left out).
pub fn diff(text: &str, max_lines: usize) -> (String, bool) {
    let mut out = String::from("<pre class=\"diff\">");
    let mut in_header = false;
    let mut lines = text.lines();
    for line in lines.by_ref().take(max_lines) {
        if line.starts_with("diff --git ") {
            in_header = true;
        } else if line.starts_with("@@") {
            in_header = false;
        }
        let class = if in_header {
            "meta"
        } else if line.starts_with("@@") {
            "hunk"
        } else if line.starts_with('+') {
            "add"
        } else if line.starts_with('-') {
            "del"
        } else {
            "ctx"
        };
        // One block per line (the CSS), no newline between: a `pre` would show it twice.
        let _ = write!(
            out,
            "<span class=\"{class}\">{}</span>",
            log_text(line.as_bytes())
        );
    }
    out.push_str("</pre>");
    (out, lines.next().is_some())
}

/// The state badge of a smith.
pub fn badge(state: &str) -> String {
    let class = match state {
        "idle" | "queued" | "running" | "waiting" | "done" | "failed" | "cancelled" => state,
        _ => "unknown",
    };
    format!("<span class=\"badge {class}\">{}</span>", esc(state))
}

/// What the page shell needs to know.
pub struct Shell<'a> {
    /// The page's title (escaped here).
    pub title: &'a str,
    /// The mount (or store) directory, shown in the header.
    pub dir: &'a str,
    /// The tree is mounted (actions possible); else the banner says read-only.
    pub mounted: bool,
    /// Refresh the page every few seconds when JavaScript is off (`<noscript>` meta refresh).
    pub refresh: bool,
    /// The page's kind, for the script (`tree`, `smith`, `log`, `events`, `other`).
    pub kind: &'a str,
}

/// A whole page: head (our stylesheet and script only), header with the navigation and the
/// mount banner, then `body` (already HTML).
pub fn page(s: &Shell<'_>, body: &str) -> String {
    let refresh = if s.refresh {
        "<noscript><meta http-equiv=\"refresh\" content=\"5\"></noscript>"
    } else {
        ""
    };
    let banner = if s.mounted {
        String::from("<div id=\"banner\" class=\"banner hidden\"></div>")
    } else {
        String::from(
            "<div id=\"banner\" class=\"banner\">not mounted: read-only (read from the store; \
             actions need a mount)</div>",
        )
    };
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{title} · smithfs</title>{refresh}\
         <link rel=\"stylesheet\" href=\"static/ui.css\">\
         <script src=\"static/ui.js\" defer></script></head>\
         <body data-page=\"{kind}\" data-mounted=\"{mounted}\" class=\"{ro}\">\
         <header><a class=\"brand\" href=\"./\">smithfs</a> <span class=\"dir\">{dir}</span>\
         <nav><a href=\"./\">tree</a> <a href=\"events\">events</a> <a href=\"task\">new task</a></nav>\
         </header>{banner}<main>{body}</main></body></html>\n",
        title = esc(s.title),
        kind = esc(s.kind),
        mounted = s.mounted,
        ro = if s.mounted { "" } else { "readonly" },
        dir = esc(s.dir),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_html_and_terminal() {
        assert_eq!(
            esc("<script>alert('x')</script>&\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;"
        );
        assert_eq!(
            log_text(b"\x1b[31mred\x1b[0m\n"),
            "\u{241b}[31mred\u{241b}[0m\n"
        );
        assert_eq!(
            log_text(b"a\xff\xfeb\r\x07"),
            "a\u{fffd}\u{fffd}b\u{240d}\u{2407}"
        );
        assert_eq!(
            log_text("<b>\u{9b}</b>".as_bytes()),
            "&lt;b&gt;\u{fffd}&lt;/b&gt;"
        );
        assert_eq!(log_text(b"\x7f\t"), "\u{2421}\t");
        assert_eq!(
            log_text("a\u{202e}b\u{2066}c\u{200f}".as_bytes()),
            "a\u{27e8}U+202E\u{27e9}b\u{27e8}U+2066\u{27e9}c\u{27e8}U+200F\u{27e9}"
        );
    }

    #[test]
    fn renders_a_diff() {
        let (d, cut) = diff(
            "diff --git a/x b/x\nindex 1..2\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-old <i>\n+new\n ctx\n",
            100,
        );
        assert!(!cut);
        let (short, cut) = diff("+a\n+b\n+c\n", 2);
        assert!(
            cut && short.contains("+b") && !short.contains("+c"),
            "{short}"
        );
        assert!(d.contains("<span class=\"meta\">--- a/x</span>"), "{d}");
        assert!(d.contains("<span class=\"meta\">+++ b/x</span>"), "{d}");
        assert!(d.contains("<span class=\"hunk\">@@ -1 +1 @@</span>"), "{d}");
        assert!(
            d.contains("<span class=\"del\">-old &lt;i&gt;</span>"),
            "{d}"
        );
        assert!(d.contains("<span class=\"add\">+new</span>"), "{d}");
        assert!(d.contains("<span class=\"ctx\"> ctx</span>"), "{d}");
    }

    #[test]
    fn badge_classes_are_fixed() {
        assert_eq!(
            badge("failed"),
            "<span class=\"badge failed\">failed</span>"
        );
        assert_eq!(
            badge("x\" onclick=\"y"),
            "<span class=\"badge unknown\">x&quot; onclick=&quot;y</span>"
        );
    }
}
