;;; magent-store-machine-tests.el --- ERT: the status buffer names this machine  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; A real backend keeps this machine's id and name in its state
;; directory; the status buffer says the name, the one a fork made here
;; is titled with, and a name edited there is the one said next.

;;; Code:

(require 'ert)
(require 'json)
(require 'magent-store-status-tests)

(ert-deftest magent-store-machine-the-status-buffer-names-this-machine ()
  (magent-store-status-test--with-backend messages
    (magent-store-start)
    (let ((file (expand-file-name "state/magent-store/machine.json" tmp)))
      (should (string-match-p (format "^This machine: +%s$" (regexp-quote (system-name)))
                              (magent-store-status-test--text)))
      (should (string-match-p "^Other machines: +0 conflict copies merged, 0 forks made$"
                              (magent-store-status-test--text)))
      (should (file-exists-p file))
      (let ((id (alist-get 'id (json-read-file file))))
        (magent-store-stop)
        (with-temp-file file
          (insert (json-encode `((id . ,id) (name . "desk")))))
        (magent-store-start)
        (should (string-match-p "^This machine: +desk$" (magent-store-status-test--text)))
        (should (equal (alist-get 'id (json-read-file file)) id))))))

(ert-deftest magent-store-machine-the-status-buffer-counts-conflict-copies-merged ()
  "A conflict copy a sync engine made is merged when the session is opened
here, and the status buffer counts it; with no error, it says none."
  (magent-store-status-test--with-backend messages
    (magent-store-start)
    (magent-store-open "s1")
    (magent-store-put-header "s1" '((id . "s1") (schema-version . 7) (title . "named here")))
    (magent-store-flush "s1")
    (magent-store-close "s1")
    (let* ((header (expand-file-name "global/s1.json" magent-store-root))
           (copy (expand-file-name "global/s1.sync-conflict-20261202-101500-ABCDEFG.json"
                                   magent-store-root))
           (theirs (json-read-file header)))
      (setf (alist-get 'title theirs) "named there")
      (with-temp-file copy (insert (json-encode theirs)))
      (set-file-times copy (time-add (file-attribute-modification-time
                                      (file-attributes header))
                                     60))
      ;; Opened again to write in it, the session takes the copy in.
      (magent-store-open "s1")
      (magent-store-flush "s1")
      (should-not (file-exists-p copy))
      (should (equal (alist-get 'title (json-read-file header)) "named there"))
      (let ((text (magent-store-status-test--text)))
        (should (string-match-p "^Other machines: +1 conflict copies merged, 0 forks made$" text))
        (should (string-match-p "^Last error: +none$" text))))))

(provide 'magent-store-machine-tests)
;;; magent-store-machine-tests.el ends here
