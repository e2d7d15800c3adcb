"""Small pieces shared by every service and the SDK."""
