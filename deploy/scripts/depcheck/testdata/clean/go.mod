module kiln

go 1.22
