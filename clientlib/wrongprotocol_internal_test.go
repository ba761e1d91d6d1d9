package clientlib

import "testing"

// The first bytes of coordd's HTTP port (an HTTP/2 SETTINGS frame naming
// the gRPC port) make a plaintext client say so; the same bytes under TLS
// are a server's handshake that happens to look like it (seen in CI as
// "is coordd's HTTP port ..., its gRPC port, 3156539112" for a TLS
// client of the gRPC port), and must not.
func TestOnlyAPlaintextClientReadsTheHTTPPortsSettings(t *testing.T) {
	// length 6, type SETTINGS (4), no ACK, stream 0; setting 0xc0dd = 7420.
	settings := []byte{0, 0, 6, 4, 0, 0, 0, 0, 0, 0xc0, 0xdd, 0, 0, 0x1c, 0xfc}
	err := wrongProtocol(settings, "127.0.0.1:7421", false)
	if err == nil || err.Error() != "127.0.0.1:7421 is coordd's HTTP port (REST and the console), it says; clients need its gRPC port, 7420 (coordd --grpc-addr)" {
		t.Fatalf("a plaintext client of the HTTP port: %v", err)
	}
	if err := wrongProtocol(settings, "127.0.0.1:7420", true); err != nil {
		t.Fatalf("a TLS client's handshake bytes taken for the HTTP port's settings: %v", err)
	}
	if err := wrongProtocol([]byte("HTTP/1.1 400 Bad Request\r\n"), "127.0.0.1:7420", true); err == nil {
		t.Fatal("a plaintext HTTP/1 answer to a TLS client: not refused")
	}
}
