//! Token ids to streamed text: each token decodes the whole id list again (so multi-byte
//! characters split across tokens come out whole) and only what is new is emitted. Stop strings
//! are matched on the decoded text, across token boundaries: text that could still be the start
//! of a stop string is held back until it is known not to be one, and a match ends the text just
//! before it. `dspark generate` prints through this same type, so its text equals the server's.

use gemma4::tokenizer::{Tokenizer, TokenizerError};

/// Incremental detokenizer with stop strings (see the module docs).
pub struct TextStream<'t> {
    tok: &'t Tokenizer,
    stops: Vec<String>,
    /// Special tokens whose text is kept.
    kept: Vec<u32>,
    ids: Vec<u32>,
    /// The decoded text the emitted pieces are measured against.
    decoded: String,
    /// Bytes of `decoded` already emitted.
    sent: usize,
    stopped: bool,
}

/// What one token added.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Piece {
    /// New text, possibly empty (held back, or an incomplete character).
    pub text: String,
    /// A stop string matched: the text ended before it, and generation should end.
    pub stopped: bool,
}

impl<'t> TextStream<'t> {
    /// A stream over `tok`; empty stop strings are ignored.
    pub fn new(tok: &'t Tokenizer, stops: &[String]) -> TextStream<'t> {
        TextStream::keeping(tok, stops, &[])
    }

    /// A stream that keeps the text of the special tokens `kept` (see
    /// [`Tokenizer::decode_keeping`]).
    pub fn keeping(tok: &'t Tokenizer, stops: &[String], kept: &[u32]) -> TextStream<'t> {
        let stops = stops.iter().filter(|s| !s.is_empty()).cloned().collect();
        let kept = kept.to_vec();
        TextStream { tok, stops, kept, ids: Vec::new(), decoded: String::new(), sent: 0, stopped: false }
    }

    /// Adds a token and returns the text it releases. After a stop string matched, tokens add
    /// nothing.
    pub fn push(&mut self, id: u32) -> Result<Piece, TokenizerError> {
        if self.stopped {
            return Ok(Piece { text: String::new(), stopped: true });
        }
        self.ids.push(id);
        let text = self.tok.decode_keeping(&self.ids, &self.kept)?;
        if !text.starts_with(&self.decoded[..self.sent]) {
            // The decoding of earlier ids changed (a tokenizer that merges across tokens): what
            // was sent stays sent, and later pieces are measured against the new text.
            self.decoded = text;
            self.sent = self.decoded.len();
            return Ok(Piece::default());
        }
        self.decoded = text;
        // A stop string can only end in the new text, but may start in text held back before.
        let search_from = self.sent;
        if let Some(at) = self.first_stop(search_from) {
            let piece = self.decoded[self.sent..at].to_string();
            self.decoded.truncate(at);
            self.sent = at;
            self.stopped = true;
            return Ok(Piece { text: piece, stopped: true });
        }
        let end = self.decoded.len() - self.held_back();
        let piece = self.decoded[self.sent..end].to_string();
        self.sent = end;
        Ok(Piece { text: piece, stopped: false })
    }

    /// The text still held back (when generation ends without a stop string, it is released).
    pub fn flush(&mut self) -> String {
        let rest = self.decoded[self.sent..].to_string();
        self.sent = self.decoded.len();
        rest
    }

    /// All text emitted so far.
    pub fn text(&self) -> &str {
        &self.decoded[..self.sent]
    }

    /// Byte offset of the first stop string that occurs at or after `from`.
    fn first_stop(&self, from: usize) -> Option<usize> {
        self.stops.iter().filter_map(|s| self.decoded[from..].find(s.as_str()).map(|i| from + i)).min()
    }

    /// Length of the longest unsent suffix of the text that is a proper prefix of a stop string.
    fn held_back(&self) -> usize {
        gemma4::chat_markup::held_back(&self.decoded[self.sent..], &self.stops)
    }
}
