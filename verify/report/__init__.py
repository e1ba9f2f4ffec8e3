"""Report writers: Markdown, self-contained HTML, figures and JSON, rendered from Evidence alone."""
from .write import write_report

__all__ = ["write_report"]
