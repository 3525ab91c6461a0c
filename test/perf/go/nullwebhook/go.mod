module mcad.local/nullwebhook

go 1.22
