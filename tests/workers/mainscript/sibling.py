VALUE = "sibling module imported"
