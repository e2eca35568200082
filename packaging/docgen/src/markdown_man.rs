//! Man pages from the Markdown pages of `docs/reference/`, so that each
//! reference has one source (the page people read on the web) and the
//! installed man page cannot drift from it.
//!
//! The pages keep to a small part of Markdown, and anything else is an
//! error rather than a man page that silently lost it:
//! * `#` is the page's title ("NAME — what it is"), and what follows it up
//!   to the first `##` is the page's preface for readers of the web page
//!   (not rendered);
//! * `##` is a section (`.SH`), `###` a subsection (`.SS`), `####` a tagged
//!   paragraph (`.TP`, for one key or option and what follows it);
//! * paragraphs, bullet lists (nested too), code blocks, `code`, *emphasis*,
//!   **strong** and links (their text).
//!
//! Tables, images, HTML and the like are refused.

use anyhow::{bail, Result};
use pulldown_cmark::{CodeBlockKind, Event, HeadingLevel, Options, Parser, Tag, TagEnd};
use roff::{bold, italic, roman, Inline, Roff};

/// The header line of a page: `.TH TITLE SECTION DATE SOURCE MANUAL`.
pub struct Header<'a> {
    pub title: &'a str,
    pub section: &'a str,
    pub date: &'a str,
    pub source: &'a str,
    pub manual: &'a str,
}

/// A whole page: `.TH`, NAME from the `#` title, then the sections.
pub fn page(markdown: &str, header: &Header) -> Result<String> {
    let mut roff = Roff::new();
    roff.control(
        "TH",
        [
            header.title,
            header.section,
            header.date,
            header.source,
            header.manual,
        ],
    );
    let mut writer = Writer::new(roff, Mode::Page);
    writer.run(markdown)?;
    Ok(writer.roff.render())
}

/// The sections of a page, to append to another page under `.SH
/// HEADING`: the page's `##` become `.SS`, its `###` too.
pub fn section(markdown: &str, heading: &str) -> Result<String> {
    let mut roff = Roff::new();
    roff.control("SH", [heading]);
    let mut writer = Writer::new(roff, Mode::Section);
    writer.run(markdown)?;
    Ok(writer.roff.render())
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Page,
    Section,
}

/// Where the next paragraph goes.
#[derive(Clone, Copy, PartialEq)]
enum Place {
    /// A new paragraph (`.PP`).
    Body,
    /// Right after a `.TP` tag or a list bullet: no request of its own.
    Attached,
    /// A further paragraph of a tagged paragraph or list item (`.IP`).
    Indented,
}

struct Writer {
    roff: Roff,
    mode: Mode,
    /// Inside the preface (between `#` and the first `##`): skipped.
    in_preface: bool,
    place: Place,
    /// Inside a `####` tagged paragraph: paragraphs after the first are
    /// indented like it.
    in_tagged: bool,
    list_depth: usize,
    /// The inline text being collected, and the fonts in force.
    inlines: Vec<Inline>,
    bold_depth: usize,
    italic_depth: usize,
    /// The text of a heading or code block being collected.
    heading: Option<HeadingLevel>,
    code_block: Option<String>,
}

impl Writer {
    fn new(roff: Roff, mode: Mode) -> Self {
        Self {
            roff,
            mode,
            in_preface: false,
            place: Place::Body,
            in_tagged: false,
            list_depth: 0,
            inlines: Vec::new(),
            bold_depth: 0,
            italic_depth: 0,
            heading: None,
            code_block: None,
        }
    }

    fn run(&mut self, markdown: &str) -> Result<()> {
        for event in Parser::new_ext(markdown, Options::ENABLE_TABLES) {
            self.event(event)?;
        }
        Ok(())
    }

    fn event(&mut self, event: Event) -> Result<()> {
        if let Some(code) = &mut self.code_block {
            match event {
                Event::Text(text) => code.push_str(&text),
                Event::End(TagEnd::CodeBlock) => self.end_code_block(),
                other => bail!("unexpected {other:?} in a code block"),
            }
            return Ok(());
        }
        match event {
            Event::Start(Tag::Heading { level, .. }) => {
                self.heading = Some(level);
                self.inlines.clear();
            }
            Event::End(TagEnd::Heading(level)) => self.end_heading(level),
            Event::Start(Tag::Paragraph) => self.inlines.clear(),
            Event::End(TagEnd::Paragraph) => self.end_paragraph(),
            Event::Start(Tag::List(None)) => {
                self.flush_item_text();
                if self.list_depth > 0 {
                    self.roff.control("RS", [] as [&str; 0]);
                }
                self.list_depth += 1;
            }
            Event::End(TagEnd::List(false)) => {
                self.flush_item_text();
                self.list_depth -= 1;
                if self.list_depth > 0 {
                    self.roff.control("RE", [] as [&str; 0]);
                }
                self.place = if self.in_tagged {
                    Place::Indented
                } else {
                    Place::Body
                };
            }
            Event::Start(Tag::Item) => {
                self.inlines.clear();
                if !self.in_preface {
                    self.roff.control("IP", ["\\(bu", "2"]);
                }
                self.place = Place::Attached;
            }
            // Tight list items hold their text without a paragraph.
            Event::End(TagEnd::Item) => self.flush_item_text(),
            Event::Start(Tag::CodeBlock(kind)) => {
                if let CodeBlockKind::Indented = kind {
                    bail!("indented code blocks are not supported: fence them");
                }
                self.flush_item_text();
                self.code_block = Some(String::new());
            }
            Event::Start(Tag::Emphasis) => self.italic_depth += 1,
            Event::End(TagEnd::Emphasis) => self.italic_depth -= 1,
            Event::Start(Tag::Strong) => self.bold_depth += 1,
            Event::End(TagEnd::Strong) => self.bold_depth -= 1,
            // A link reads as its text.
            Event::Start(Tag::Link { .. }) | Event::End(TagEnd::Link) => {}
            Event::Text(text) => {
                let inline = self.styled(&text);
                self.inlines.push(inline);
            }
            Event::Code(code) => self.inlines.push(bold(code.to_string())),
            Event::SoftBreak => self.inlines.push(roman(" ")),
            Event::HardBreak => self.inlines.push(roff::line_break()),
            other => bail!("{other:?} cannot be written in a man page"),
        }
        Ok(())
    }

    fn styled(&self, text: &str) -> Inline {
        if self.bold_depth > 0 {
            bold(text)
        } else if self.italic_depth > 0 {
            italic(text)
        } else {
            roman(text)
        }
    }

    fn take_text(&mut self) -> Vec<Inline> {
        std::mem::take(&mut self.inlines)
    }

    /// The plain words of a heading.
    fn heading_text(&mut self) -> String {
        self.take_text()
            .into_iter()
            .map(|inline| match inline {
                Inline::Roman(text) | Inline::Italic(text) | Inline::Bold(text) => text,
                Inline::LineBreak => " ".into(),
            })
            .collect()
    }

    fn end_heading(&mut self, level: HeadingLevel) {
        self.heading = None;
        self.in_tagged = false;
        self.place = Place::Body;
        match (self.mode, level) {
            (Mode::Page, HeadingLevel::H1) => {
                let title = self.heading_text();
                let (name, what) = title.split_once(" — ").unwrap_or((&title, ""));
                self.roff.control("SH", ["NAME"]);
                self.roff.text([roman(format!("{name} - {what}"))]);
                self.in_preface = true;
            }
            (Mode::Section, HeadingLevel::H1) => {
                self.take_text();
                self.in_preface = true;
            }
            (Mode::Page, HeadingLevel::H2) => {
                self.in_preface = false;
                let text = self.heading_text().to_uppercase();
                self.roff.control("SH", [text.as_str()]);
            }
            (_, HeadingLevel::H2 | HeadingLevel::H3) => {
                self.in_preface = false;
                let text = self.heading_text();
                self.roff.control("SS", [text.as_str()]);
            }
            (_, _) => {
                // A tagged paragraph: the heading's words are the tag.
                self.in_preface = false;
                let tag = self.take_text();
                self.roff.control("TP", [] as [&str; 0]);
                self.roff.text(tag);
                self.in_tagged = true;
                self.place = Place::Attached;
            }
        }
    }

    fn end_paragraph(&mut self) {
        let text = self.take_text();
        if self.in_preface {
            return;
        }
        match self.place {
            Place::Body => {
                self.roff.control("PP", [] as [&str; 0]);
            }
            Place::Indented => {
                self.roff.control("IP", [] as [&str; 0]);
            }
            Place::Attached => {}
        }
        self.roff.text(text);
        self.place = if self.in_tagged || self.list_depth > 0 {
            Place::Indented
        } else {
            Place::Body
        };
    }

    /// The text of a tight list item, which comes without a paragraph.
    fn flush_item_text(&mut self) {
        if self.inlines.is_empty() || self.heading.is_some() {
            return;
        }
        let text = self.take_text();
        if !self.in_preface {
            self.roff.text(text);
        }
        self.place = Place::Indented;
    }

    fn end_code_block(&mut self) {
        let code = self.code_block.take().unwrap_or_default();
        if self.in_preface {
            return;
        }
        if self.place == Place::Body {
            self.roff.control("PP", [] as [&str; 0]);
        }
        self.roff.control("RS", ["4"]);
        self.roff.control("nf", [] as [&str; 0]);
        for line in code.trim_end_matches('\n').split('\n') {
            self.roff.text([roman(line)]);
        }
        self.roff.control("fi", [] as [&str; 0]);
        self.roff.control("RE", [] as [&str; 0]);
        self.place = if self.in_tagged || self.list_depth > 0 {
            Place::Indented
        } else {
            Place::Body
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: Header = Header {
        title: "X",
        section: "5",
        date: "2026-12-04",
        source: "x 1",
        manual: "File Formats",
    };

    #[test]
    fn headings_paragraphs_and_tags() {
        let page = page(
            "# x.toml — a file\n\nPreface for the web.\n\n## Description\n\nOne `key` and *this*.\n\n### Keys\n\n#### `size` (integer)\n\nThe size.\n\nMore.\n",
            &HEADER,
        )
        .unwrap();
        assert!(
            page.contains("\n.TH X 5 2026-12-04 \"x 1\" \"File Formats\"\n"),
            "{page}"
        );
        assert!(page.contains(".SH NAME\nx.toml \\- a file\n"), "{page}");
        assert!(!page.contains("Preface"), "{page}");
        assert!(
            page.contains(".SH DESCRIPTION\n.PP\nOne \\fBkey\\fR and \\fIthis\\fR.\n"),
            "{page}"
        );
        assert!(
            page.contains(".SS Keys\n.TP\n\\fBsize\\fR (integer)\nThe size.\n.IP\nMore.\n"),
            "{page}"
        );
    }

    #[test]
    fn lists_and_code_blocks() {
        let page = page(
            "# x — y\n\n## A\n\n- one\n- two `2`\n  - inner\n\n```toml\nsize = 1\n.dot = 2\n```\n",
            &HEADER,
        )
        .unwrap();
        assert!(
            page.contains(
                ".IP \\(bu 2\none\n.IP \\(bu 2\ntwo \\fB2\\fR\n.RS\n.IP \\(bu 2\ninner\n.RE\n"
            ),
            "{page}"
        );
        assert!(
            page.contains(".RS 4\n.nf\nsize = 1\n\\&.dot = 2\n.fi\n.RE\n"),
            "{page}"
        );
    }

    #[test]
    fn what_a_man_page_cannot_show_is_refused() {
        for markdown in [
            "# x — y\n\n## A\n\n| a | b |\n|---|---|\n| 1 | 2 |\n",
            "# x — y\n\n<b>x</b>\n",
            "# x — y\n\n    indented\n",
        ] {
            assert!(page(markdown, &HEADER).is_err(), "{markdown:?}");
        }
    }

    #[test]
    fn a_section_to_append() {
        let text = section(
            "# The contract\n\nPreface.\n\n## Every command\n\nText.\n",
            "JSON OUTPUT",
        )
        .unwrap();
        assert!(
            text.ends_with(".SH \"JSON OUTPUT\"\n.SS \"Every command\"\n.PP\nText.\n"),
            "{text}"
        );
    }
}
