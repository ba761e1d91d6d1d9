module github.com/coordd/coordd/internal/shared

go 1.26.0
