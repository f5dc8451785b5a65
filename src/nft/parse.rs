//! A parser for the subset of nft script syntax flock writes and `nft list` prints back:
//! `table <family> <name> { ... }` blocks with chains, sets and maps, and the commands
//! `add|create table|chain|set|map|rule|element`, `flush`, `delete`. Anything else is an
//! error naming the line, so a test fails on a shape flock does not understand.

use std::fmt;

/// A lexical token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tok<'a> {
    Word(&'a str),
    Str(&'a str),
    LBrace,
    RBrace,
    Semi,
    Comma,
    Newline,
}

impl Tok<'_> {
    fn text(&self) -> String {
        let mut s = String::new();
        self.write(&mut s);
        s
    }

    fn write(&self, out: &mut String) {
        match self {
            Tok::Word(w) => out.push_str(w),
            Tok::Str(s) => {
                out.push('"');
                out.push_str(s);
                out.push('"');
            }
            Tok::LBrace => out.push('{'),
            Tok::RBrace => out.push('}'),
            Tok::Semi => out.push(';'),
            Tok::Comma => out.push(','),
            Tok::Newline => out.push_str("\\n"),
        }
    }
}

/// A parse error with its 1-based line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct ParseError {
    pub(crate) line: usize,
    pub(crate) message: String,
}

/// Splits nft text into tokens (with their lines). `#` starts a comment outside strings;
/// a `,` ends a word only when followed by whitespace or a brace, so
/// `ct state established,related` keeps its list in one word.
pub(crate) fn tokenize(text: &str) -> Result<Vec<(Tok<'_>, usize)>, ParseError> {
    // Byte offsets into `text`: every character that ends a token is ASCII, so an offset
    // found by one is always a character boundary, and a token is one slice of the text.
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(text.len() / 6);
    let mut line = 1;
    let mut i = 0;
    while i < bytes.len() {
        let single = match bytes[i] {
            b'\n' => Some(Tok::Newline),
            b'{' => Some(Tok::LBrace),
            b'}' => Some(Tok::RBrace),
            b';' => Some(Tok::Semi),
            b',' => Some(Tok::Comma),
            _ => None,
        };
        if let Some(t) = single {
            out.push((t, line));
            line += usize::from(bytes[i] == b'\n');
            i += 1;
            continue;
        }
        match bytes[i] {
            b' ' | b'\t' | b'\r' => i += 1,
            b'#' => i = text[i..].find('\n').map_or(bytes.len(), |n| i + n),
            b'"' => {
                let start = i + 1;
                // Two single-character searches (memchr) rather than one for either
                // character: strings are nft's comments, most of a ruleset's text.
                let end = match text[start..].find('"') {
                    Some(n) if !text[start..start + n].contains('\n') => start + n,
                    Some(_) => return Err(ParseError { line, message: "newline in string".into() }),
                    None if text[start..].contains('\n') => return Err(ParseError { line, message: "newline in string".into() }),
                    None => return Err(ParseError { line, message: "unterminated string".into() }),
                };
                out.push((Tok::Str(&text[start..end]), line));
                i = end + 1;
            }
            _ => {
                let rest = &text[i..];
                let end = word_len(rest);
                if end == 0 {
                    // Whitespace beyond ASCII between tokens.
                    i += rest.chars().next().map_or(1, char::len_utf8);
                    continue;
                }
                out.push((Tok::Word(&rest[..end]), line));
                i += end;
            }
        }
    }
    Ok(out)
}

/// The length of the word `rest` starts with: up to whitespace, `{`, `}`, `;`, `"`, or a `,`
/// followed by whitespace, a brace or the end. Bytewise: only a non-ASCII character is decoded
/// (to see whether it is whitespace).
fn word_len(rest: &str) -> usize {
    let bytes = rest.as_bytes();
    let mut end = 0;
    while let Some(&b) = bytes.get(end) {
        if b.is_ascii() {
            let ends_list = || rest[end + 1..].chars().next().is_none_or(|n| n.is_whitespace() || matches!(n, '{' | '}'));
            // b'\x0b' (vertical tab) is whitespace to `char::is_whitespace`, not to the ASCII test.
            if b.is_ascii_whitespace() || b == b'\x0b' || matches!(b, b'{' | b'}' | b';' | b'"') || (b == b',' && ends_list()) {
                break;
            }
            end += 1;
        } else {
            match rest[end..].chars().next() {
                Some(ch) if !ch.is_whitespace() => end += ch.len_utf8(),
                _ => break,
            }
        }
    }
    end
}

/// Joins tokens into canonical text: single spaces, `,` attached to what precedes it.
pub(crate) fn join(toks: &[Tok<'_>]) -> String {
    let mut s = String::new();
    for t in toks {
        if *t == Tok::Comma {
            s.push(',');
            continue;
        }
        if !s.is_empty() {
            s.push(' ');
        }
        t.write(&mut s);
    }
    s
}

/// nft object kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Chain,
    Set,
    Map,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Chain => "chain",
            Kind::Set => "set",
            Kind::Map => "map",
        })
    }
}

/// A set or map element: normalised key, optional comment, optional verdict (maps), and for
/// an element of a timed set as nft lists it, its timeout and what is left of it
/// (`timeout 30s expires 12s500ms`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Elem {
    pub(crate) key: String,
    pub(crate) comment: Option<String>,
    pub(crate) verdict: Option<String>,
    pub(crate) timeout: Option<String>,
    pub(crate) expires: Option<String>,
}

/// Declared attributes of a chain.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct ChainSpec {
    /// `type filter hook forward priority filter; policy accept;` normalised, for base chains.
    pub(crate) hook: Option<String>,
    pub(crate) comment: Option<String>,
}

/// Declared attributes of a set or map.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct SetSpec {
    /// `ipv4_addr . inet_proto . inet_service`, or `ifname : verdict` for a map.
    pub(crate) type_: String,
    pub(crate) flags: Vec<String>,
    /// `rate 20/second burst 50 packets`: each element's own limit, as `limit ...` declares it.
    pub(crate) limit: Option<String>,
    pub(crate) comment: Option<String>,
}

/// One operation of a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Command {
    AddTable { family: String, table: String, comment: Option<String> },
    AddChain { family: String, table: String, name: String, spec: ChainSpec, create: bool },
    AddSet { family: String, table: String, kind: Kind, name: String, spec: SetSpec, create: bool },
    AddRule { family: String, table: String, chain: String, rule: String },
    AddElements { family: String, table: String, set: String, elements: Vec<Elem> },
    DeleteElements { family: String, table: String, set: String, elements: Vec<Elem> },
    Flush { family: String, table: String, kind: Kind, name: String },
    Delete { family: String, table: String, kind: Kind, name: String },
    FlushTable { family: String, table: String },
    DeleteTable { family: String, table: String },
}

/// Parses a script into commands, in order. A `table { ... }` block becomes the `add`
/// commands it stands for.
pub(crate) fn parse(text: &str) -> Result<Vec<Command>, ParseError> {
    let toks = tokenize(text)?;
    let mut p = Parser { toks, pos: 0, out: Vec::new() };
    p.script()?;
    Ok(p.out)
}

struct Parser<'a> {
    toks: Vec<(Tok<'a>, usize)>,
    pos: usize,
    out: Vec<Command>,
}

impl<'a> Parser<'a> {
    fn line(&self) -> usize {
        self.toks.get(self.pos).or_else(|| self.toks.last()).map_or(1, |t| t.1)
    }

    fn err<T>(&self, message: impl Into<String>) -> Result<T, ParseError> {
        Err(ParseError { line: self.line(), message: message.into() })
    }

    fn peek(&self) -> Option<&Tok<'a>> {
        self.toks.get(self.pos).map(|t| &t.0)
    }

    fn next(&mut self) -> Option<Tok<'a>> {
        let t = self.toks.get(self.pos).map(|t| t.0);
        if t.is_some() {
            self.pos += 1;
        }
        t
    }

    fn skip_newlines(&mut self) {
        while matches!(self.peek(), Some(Tok::Newline | Tok::Semi)) {
            self.pos += 1;
        }
    }

    fn word(&mut self, what: &str) -> Result<String, ParseError> {
        match self.next() {
            Some(Tok::Word(w)) => Ok(w.to_string()),
            Some(t) => self.err(format!("expected {what}, found {}", t.text())),
            None => self.err(format!("expected {what}, found end of input")),
        }
    }

    fn string(&mut self, what: &str) -> Result<String, ParseError> {
        match self.next() {
            Some(Tok::Str(s)) => Ok(s.to_string()),
            Some(t) => self.err(format!("expected {what} (a quoted string), found {}", t.text())),
            None => self.err(format!("expected {what}, found end of input")),
        }
    }

    fn expect(&mut self, want: &Tok<'_>) -> Result<(), ParseError> {
        match self.next() {
            Some(t) if t == *want => Ok(()),
            Some(t) => self.err(format!("expected {}, found {}", want.text(), t.text())),
            None => self.err(format!("expected {}, found end of input", want.text())),
        }
    }

    fn keyword(&mut self, kw: &str) -> Result<(), ParseError> {
        let w = self.word(kw)?;
        if w == kw { Ok(()) } else { self.err(format!("expected {kw}, found {w}")) }
    }

    /// Tokens up to the end of the statement (newline or `;` outside braces).
    fn statement(&mut self) -> Result<Vec<Tok<'a>>, ParseError> {
        let mut depth = 0usize;
        let mut toks = Vec::new();
        while let Some(t) = self.peek() {
            match t {
                Tok::Newline | Tok::Semi if depth == 0 => break,
                Tok::Newline => {
                    self.pos += 1;
                    continue;
                }
                Tok::RBrace if depth == 0 => break,
                Tok::LBrace => depth += 1,
                Tok::RBrace => depth -= 1,
                _ => {}
            }
            toks.extend(self.next());
        }
        Ok(toks)
    }

    fn script(&mut self) -> Result<(), ParseError> {
        loop {
            self.skip_newlines();
            let Some(tok) = self.next() else { return Ok(()) };
            let Tok::Word(verb) = tok else { return self.err(format!("expected a command, found {}", tok.text())) };
            match verb {
                "table" => self.table_block()?,
                "add" | "create" => self.add(verb == "create")?,
                "flush" | "delete" => self.flush_delete(verb == "flush")?,
                other => return self.err(format!("unsupported command {other:?}")),
            }
        }
    }

    fn family_table(&mut self) -> Result<(String, String), ParseError> {
        let family = self.word("a family")?;
        if !matches!(family.as_str(), "inet" | "ip" | "ip6" | "arp" | "bridge" | "netdev") {
            return self.err(format!("unknown family {family:?}"));
        }
        let table = self.word("a table name")?;
        Ok((family, table))
    }

    /// A `table { ... }` block. Like nft, every chain and set of the block is declared before
    /// any rule or element is added, so content may refer to objects written later in the
    /// block (as `nft list` prints maps before the chains their elements jump to).
    fn table_block(&mut self) -> Result<(), ParseError> {
        let (family, table) = self.family_table()?;
        self.expect(&Tok::LBrace)?;
        let mut comment = None;
        let mut decls = Vec::new();
        let mut content = Vec::new();
        loop {
            self.skip_newlines();
            match self.next() {
                Some(Tok::RBrace) => break,
                Some(Tok::Word(w)) => match w {
                    "comment" => comment = Some(self.string("a comment")?),
                    "chain" => {
                        let name = self.word("a chain name")?;
                        self.expect(&Tok::LBrace)?;
                        let (spec, rules) = self.chain_body()?;
                        decls.push(Command::AddChain {
                            family: family.clone(),
                            table: table.clone(),
                            name: name.clone(),
                            spec,
                            create: false,
                        });
                        for rule in rules {
                            content.push(Command::AddRule { family: family.clone(), table: table.clone(), chain: name.clone(), rule });
                        }
                    }
                    "set" | "map" => {
                        let kind = if w == "set" { Kind::Set } else { Kind::Map };
                        let name = self.word("a set name")?;
                        self.expect(&Tok::LBrace)?;
                        let (spec, elements) = self.set_body()?;
                        decls.push(Command::AddSet {
                            family: family.clone(),
                            table: table.clone(),
                            kind,
                            name: name.clone(),
                            spec,
                            create: false,
                        });
                        if !elements.is_empty() {
                            content.push(Command::AddElements { family: family.clone(), table: table.clone(), set: name, elements });
                        }
                    }
                    other => return self.err(format!("unsupported table statement {other:?}")),
                },
                Some(t) => return self.err(format!("unexpected {} in table", t.text())),
                None => return self.err("unterminated table block"),
            }
        }
        self.out.push(Command::AddTable { family, table, comment });
        // Sets before chains, as nft does (rules look sets up; chains are only referenced by
        // rules and elements, which come after all declarations).
        decls.sort_by_key(|c| matches!(c, Command::AddChain { .. }));
        self.out.extend(decls);
        self.out.extend(content);
        Ok(())
    }

    /// Chain body after `{`, through `}`: comment, hook line, rules.
    fn chain_body(&mut self) -> Result<(ChainSpec, Vec<String>), ParseError> {
        let mut spec = ChainSpec::default();
        let mut rules = Vec::new();
        loop {
            self.skip_newlines();
            match self.peek() {
                Some(Tok::RBrace) => {
                    self.pos += 1;
                    return Ok((spec, rules));
                }
                None => return self.err("unterminated chain"),
                Some(Tok::Word(w)) if *w == "comment" => {
                    self.pos += 1;
                    spec.comment = Some(self.string("a comment")?);
                }
                Some(Tok::Word(w)) if *w == "type" => {
                    let mut hook = self.statement()?;
                    self.expect(&Tok::Semi)?;
                    if matches!(self.peek(), Some(Tok::Word(w)) if *w == "policy") {
                        hook.push(Tok::Semi);
                        hook.extend(self.statement()?);
                    }
                    hook.push(Tok::Semi);
                    spec.hook = Some(join(&hook).replace(" ;", ";"));
                }
                Some(_) => {
                    let toks = self.statement()?;
                    if toks.is_empty() {
                        return self.err("empty rule");
                    }
                    rules.push(join(&toks));
                }
            }
        }
    }

    /// Set or map body after `{`, through `}`.
    fn set_body(&mut self) -> Result<(SetSpec, Vec<Elem>), ParseError> {
        let mut spec = SetSpec::default();
        let mut elements = Vec::new();
        loop {
            self.skip_newlines();
            let Some(tok) = self.next() else { return self.err("unterminated set") };
            match tok {
                Tok::RBrace => return Ok((spec, elements)),
                Tok::Word(w) => match w {
                    "type" | "typeof" => spec.type_ = join(&self.statement()?),
                    "flags" => spec.flags = join(&self.statement()?).split(',').map(|f| f.trim().to_string()).collect(),
                    "comment" => spec.comment = Some(self.string("a comment")?),
                    "limit" => spec.limit = Some(join(&self.statement()?)),
                    "elements" => {
                        self.keyword("=")?;
                        self.expect(&Tok::LBrace)?;
                        elements = self.elements()?;
                    }
                    other => return self.err(format!("unsupported set statement {other:?}")),
                },
                t => return self.err(format!("unexpected {} in set", t.text())),
            }
        }
    }

    /// Elements after `{`, through `}`.
    fn elements(&mut self) -> Result<Vec<Elem>, ParseError> {
        let mut out = Vec::new();
        loop {
            while matches!(self.peek(), Some(Tok::Newline | Tok::Comma)) {
                self.pos += 1;
            }
            if matches!(self.peek(), Some(Tok::RBrace)) {
                self.pos += 1;
                return Ok(out);
            }
            let mut key = Vec::new();
            let mut comment = None;
            let mut verdict = None;
            let (mut timeout, mut expires) = (None, None);
            loop {
                match self.peek() {
                    None => return self.err("unterminated element list"),
                    Some(Tok::Comma | Tok::RBrace | Tok::Newline) => break,
                    Some(Tok::Word(w)) if *w == "comment" => {
                        self.pos += 1;
                        comment = Some(self.string("an element comment")?);
                    }
                    Some(Tok::Word(w)) if *w == "timeout" => {
                        self.pos += 1;
                        timeout = Some(self.word("a timeout")?);
                    }
                    // The set's limit, as nft lists it on each element: the set's declaration
                    // says it once.
                    Some(Tok::Word(w)) if *w == "limit" => {
                        self.pos += 1;
                        self.keyword("rate")?;
                        self.word("a rate")?;
                        if matches!(self.peek(), Some(Tok::Word("burst"))) {
                            self.pos += 1;
                            self.word("a burst")?;
                            self.keyword("packets")?;
                        }
                    }
                    Some(Tok::Word(w)) if *w == "expires" => {
                        self.pos += 1;
                        expires = Some(self.word("an expiry")?);
                    }
                    Some(Tok::Word(w)) if *w == ":" => {
                        self.pos += 1;
                        let mut v = Vec::new();
                        while matches!(self.peek(), Some(Tok::Word(_))) {
                            v.extend(self.next());
                        }
                        if v.is_empty() {
                            return self.err("expected a verdict after ':'");
                        }
                        verdict = Some(join(&v));
                    }
                    Some(Tok::Word(_) | Tok::Str(_)) => key.extend(self.next()),
                    Some(t) => return self.err(format!("unexpected {} in element", t.text())),
                }
            }
            if key.is_empty() {
                return self.err("empty element");
            }
            out.push(Elem { key: join(&key), comment, verdict, timeout, expires });
        }
    }

    fn add(&mut self, create: bool) -> Result<(), ParseError> {
        let what = self.word("an object kind")?;
        match what.as_str() {
            "table" => {
                let (family, table) = self.family_table()?;
                let mut comment = None;
                if matches!(self.peek(), Some(Tok::LBrace)) {
                    self.pos += 1;
                    loop {
                        self.skip_newlines();
                        match self.next() {
                            Some(Tok::RBrace) => break,
                            Some(Tok::Word("comment")) => comment = Some(self.string("a comment")?),
                            Some(t) => return self.err(format!("unexpected {} in table", t.text())),
                            None => return self.err("unterminated table"),
                        }
                    }
                }
                self.out.push(Command::AddTable { family, table, comment });
            }
            "chain" => {
                let (family, table) = self.family_table()?;
                let name = self.word("a chain name")?;
                let mut spec = ChainSpec::default();
                if matches!(self.peek(), Some(Tok::LBrace)) {
                    self.pos += 1;
                    let (s, rules) = self.chain_body()?;
                    if !rules.is_empty() {
                        return self.err("rules are not allowed in a chain declaration");
                    }
                    spec = s;
                }
                self.out.push(Command::AddChain { family, table, name, spec, create });
            }
            "set" | "map" => {
                let kind = if what == "set" { Kind::Set } else { Kind::Map };
                let (family, table) = self.family_table()?;
                let name = self.word("a set name")?;
                self.expect(&Tok::LBrace)?;
                let (spec, elements) = self.set_body()?;
                self.out.push(Command::AddSet { family: family.clone(), table: table.clone(), kind, name: name.clone(), spec, create });
                if !elements.is_empty() {
                    self.out.push(Command::AddElements { family, table, set: name, elements });
                }
            }
            "rule" => {
                let (family, table) = self.family_table()?;
                let chain = self.word("a chain name")?;
                let toks = self.statement()?;
                if toks.is_empty() {
                    return self.err("empty rule");
                }
                self.out.push(Command::AddRule { family, table, chain, rule: join(&toks) });
            }
            "element" => {
                let (family, table) = self.family_table()?;
                let set = self.word("a set name")?;
                self.expect(&Tok::LBrace)?;
                let elements = self.elements()?;
                self.out.push(Command::AddElements { family, table, set, elements });
            }
            other => return self.err(format!("unsupported object kind {other:?}")),
        }
        Ok(())
    }

    fn flush_delete(&mut self, flush: bool) -> Result<(), ParseError> {
        let what = self.word("an object kind")?;
        let kind = match what.as_str() {
            "table" => {
                let (family, table) = self.family_table()?;
                self.out.push(if flush { Command::FlushTable { family, table } } else { Command::DeleteTable { family, table } });
                return Ok(());
            }
            "element" if !flush => {
                let (family, table) = self.family_table()?;
                let set = self.word("a set name")?;
                self.expect(&Tok::LBrace)?;
                let elements = self.elements()?;
                self.out.push(Command::DeleteElements { family, table, set, elements });
                return Ok(());
            }
            "chain" => Kind::Chain,
            "set" => Kind::Set,
            "map" => Kind::Map,
            other => return self.err(format!("unsupported object kind {other:?}")),
        };
        let (family, table) = self.family_table()?;
        let name = self.word("a name")?;
        self.out.push(if flush { Command::Flush { family, table, kind, name } } else { Command::Delete { family, table, kind, name } });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokenizer_keeps_lists_in_words_and_splits_element_commas() {
        let t = tokenize("ct state established,related accept\ntcp dport { 80, 81 } # note\n").unwrap();
        let words: Vec<Tok> = t.into_iter().map(|(t, _)| t).collect();
        assert_eq!(words[2], Tok::Word("established,related"));
        assert!(words.contains(&Tok::Comma));
        assert!(!words.contains(&Tok::Word("#")));
    }

    #[test]
    fn tokens_are_slices_of_the_text_split_at_any_whitespace() {
        fn words(text: &str) -> Vec<Tok<'_>> {
            tokenize(text).unwrap().into_iter().map(|(t, _)| t).collect()
        }
        // Whitespace beyond ASCII separates words too (and once made the tokenizer spin).
        assert_eq!(words("\u{a0}add\u{2003}table\u{b}x"), [Tok::Word("add"), Tok::Word("table"), Tok::Word("x")]);
        assert_eq!(words("é,ü , c,"), [Tok::Word("é,ü"), Tok::Comma, Tok::Word("c"), Tok::Comma]);
        assert_eq!(
            words("a,{b}\"ï ;\"x"),
            [Tok::Word("a"), Tok::Comma, Tok::LBrace, Tok::Word("b"), Tok::RBrace, Tok::Str("ï ;"), Tok::Word("x")]
        );
        assert_eq!(tokenize("x \"open").unwrap_err().message, "unterminated string");
        assert_eq!(tokenize("\n\"a\nb\"").unwrap_err(), ParseError { line: 2, message: "newline in string".into() });
    }

    #[test]
    fn block_and_commands() {
        let cmds = parse(
            "table inet t {\n\tcomment \"c\"\n\tset s {\n\t\ttype ipv4_addr\n\t\tflags interval\n\t\telements = { 10.0.0.0/8 comment \"a\",\n\t\t\t     198.18.0.1 }\n\t}\n\
             \tchain base {\n\t\tcomment \"b\"\n\t\ttype filter hook forward priority filter; policy accept;\n\t\tip saddr @s tcp dport { 80, 81 } accept comment \"r\"\n\t}\n}\n\
             add map inet t m { type ifname : verdict; comment \"m\"; }\nadd element inet t m { \"flk1\" comment \"x/a\" : goto base }\n\
             flush chain inet t base\ndelete set inet t s\nadd rule inet t base counter drop\n",
        )
        .unwrap();
        assert_eq!(cmds[0], Command::AddTable { family: "inet".into(), table: "t".into(), comment: Some("c".into()) });
        let Command::AddSet { spec, .. } = &cmds[1] else { panic!("{:?}", cmds[1]) };
        assert_eq!(spec.flags, vec!["interval"]);
        let Command::AddChain { spec, .. } = &cmds[2] else { panic!() };
        assert_eq!(spec.hook.as_deref(), Some("type filter hook forward priority filter; policy accept;"));
        let Command::AddElements { elements, .. } = &cmds[3] else { panic!() };
        assert_eq!(elements.len(), 2);
        assert_eq!(elements[0].comment.as_deref(), Some("a"));
        let Command::AddRule { rule, .. } = &cmds[4] else { panic!() };
        assert_eq!(rule, "ip saddr @s tcp dport { 80, 81 } accept comment \"r\"");
        let Command::AddElements { elements, .. } = &cmds[6] else { panic!() };
        assert_eq!(elements[0].verdict.as_deref(), Some("goto base"));
        assert_eq!(elements[0].key, "\"flk1\"");
        assert!(matches!(cmds[7], Command::Flush { kind: Kind::Chain, .. }));
        assert!(matches!(cmds[8], Command::Delete { kind: Kind::Set, .. }));
    }

    #[test]
    fn errors_name_the_line() {
        let e = parse("table inet t {\n\tbogus x\n}\n").unwrap_err();
        assert_eq!(e.line, 2);
        assert!(parse("list ruleset").is_err());
        assert!(parse("table inet t {\n chain c {\n").is_err());
        assert!(parse("add rule inet t c \"unterminated\n").is_err());
    }
}
