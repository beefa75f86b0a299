"""Claims of the source documents, one module per document (``klb sim reproduce``)."""
