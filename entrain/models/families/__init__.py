"""Model families: one folder each (``base.ModelFamily``), found through ``registry``."""
