/* A log as a terminal would show it, for the dashboard's log panel (and event messages): text only,
 * never HTML. A job's log is what its process wrote to a terminal-less file: progress bars that
 * rewrite their line with a carriage return, colours and cursor moves as escape sequences. A
 * terminal shows the last state of a rewritten line; so does this. Written here rather than
 * vendored: the terminal emulators made for browsers (xterm.js …) draw into a canvas or their own
 * DOM and bring a build, where this needs a dozen rules and textContent.
 *
 * Rules: "\n" ends a line; "\r" returns to its start, and what follows overwrites it; backspace
 * steps back; CSI "K" erases in the line, "G", "C" and "D" move along it; every other escape
 * sequence (colours, cursor up/down, titles, hyperlinks) and control character is dropped. Text
 * comes in pieces: an escape sequence cut at a piece's end waits for the next piece. */
"use strict";

// CSI (ESC [ params intermediates final), OSC (ESC ] … BEL or ESC \), any other ESC + one byte;
// "\r\n" before "\r"; a run of printable text (tabs kept); one other control character.
const TERMINAL_TOKEN = /\x1b\[([0-?]*)[ -\/]*([@-~])|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]|\r\n|\r|\n|\x08|[^\x00-\x08\x0a-\x1f\x7f\x1b]+|[\x00-\x1f\x7f]/gy;
// An escape sequence that the piece ends inside of.
const UNFINISHED_ESCAPE = /\x1b(?:\[[0-?]*[ -\/]*|\][^\x07\x1b]*\x1b?)?$/;
const MAX_HELD_CHARS = 4096;

class TerminalText {
  constructor(maxLines = 2000) {
    this.maxLines = maxLines;
    this.lines = [];
    this.line = "";
    this.column = 0;
    this.held = "";
    this.version = 0;
  }

  write(piece) {
    let text = this.held + piece;
    const cut = text.match(UNFINISHED_ESCAPE);
    // Held at most a line's worth: an escape that never ends is dropped, not kept for ever.
    this.held = cut && cut[0].length < MAX_HELD_CHARS ? cut[0] : "";
    if (cut) text = text.slice(0, cut.index);
    TERMINAL_TOKEN.lastIndex = 0;
    let match;
    while (TERMINAL_TOKEN.lastIndex < text.length && (match = TERMINAL_TOKEN.exec(text))) {
      const token = match[0];
      if (token === "\n" || token === "\r\n") this.newLine();
      else if (token === "\r") this.column = 0;
      else if (token === "\x08") this.column = Math.max(0, this.column - 1);
      else if (match[2] !== undefined) this.control(match[2], match[1]);
      else if (token[0] !== "\x1b" && !/^[\x00-\x1f\x7f]$/.test(token)) this.put(token);
    }
    this.version += 1;
    return this;
  }

  /* The text printed over the line from the cursor on: what it covers is replaced. */
  put(run) {
    this.line = this.line.slice(0, this.column).padEnd(this.column) + run + this.line.slice(this.column + run.length);
    this.column += run.length;
  }

  control(final, params) {
    const n = parseInt(params, 10);
    if (final === "K") {
      if (!n) this.line = this.line.slice(0, this.column); // to the end of the line
      else if (n === 1) this.line = " ".repeat(this.column) + this.line.slice(this.column);
      else this.line = "";
    } else if (final === "G") this.column = Math.max(0, (n || 1) - 1);
    else if (final === "C") this.column += n || 1;
    else if (final === "D") this.column = Math.max(0, this.column - (n || 1));
  }

  newLine() {
    this.lines.push(this.line.trimEnd());
    // Trimmed in batches, so that a long log costs each line O(1).
    if (this.lines.length > this.maxLines * 1.5) this.lines = this.lines.slice(-this.maxLines);
    this.line = "";
    this.column = 0;
  }

  /* A line of our own (an attempt's start), on a line of its own. */
  note(text) {
    if (this.line) this.newLine();
    this.lines.push(text);
    this.version += 1;
  }

  text() {
    const lines = this.line ? [...this.lines, this.line.trimEnd()] : this.lines;
    return lines.slice(-this.maxLines).join("\n");
  }
}

/* One message (an event, an error) as plain text. */
const plainText = (message) => new TerminalText().write(String(message ?? "")).text();
