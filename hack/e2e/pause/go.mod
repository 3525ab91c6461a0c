module mcad.local/e2e/pause

go 1.26
