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

(provide 'magent-store-machine-tests)
;;; magent-store-machine-tests.el ends here
