module github.com/coordd/coordd/clientlib

go 1.26.0

require (
	github.com/coordd/coordd/fencing v0.0.0-00010101000000-000000000000
	github.com/coordd/coordd/internal/shared v0.0.0-00010101000000-000000000000
	github.com/coordd/coordd/proto v0.0.0-00010101000000-000000000000
	go.uber.org/goleak v1.3.0
	go.yaml.in/yaml/v3 v3.0.6
	google.golang.org/genproto/googleapis/rpc v0.0.0-20261019180522-ce908d29299b
	google.golang.org/grpc v1.85.0
	google.golang.org/protobuf v1.36.12
)

require (
	golang.org/x/net v0.61.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	golang.org/x/text v0.43.0 // indirect
)

replace (
	github.com/coordd/coordd/fencing => ../fencing
	github.com/coordd/coordd/internal/shared => ../internal/shared
	github.com/coordd/coordd/proto => ../proto
)
