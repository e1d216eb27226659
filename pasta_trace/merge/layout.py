"""The names a merged timeline directory is known by, shared by the single-capture
layout (timeline.py) and the cluster layout (cluster.py): each writes the marker
and timeline.load tells the two apart by its `kind`, so neither has to import
the other for them."""

MARKER = "timeline.json"
CLUSTER_KIND = "pasta-trace cluster timeline"
