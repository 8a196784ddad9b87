"""What a run produced: reading runs from the store (:mod:`.runs`), writing the report (:mod:`.report`),
the results page's view (:mod:`.page`), the terminal's (:mod:`.console`), progress and tracking."""
