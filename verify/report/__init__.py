"""Report writers: Markdown, self-contained HTML, figures and JSON, rendered from Evidence."""
